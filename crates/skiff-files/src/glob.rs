//! Path globbing for `Include` lines: `*` and `?` in any component,
//! matched with OpenSSH's pattern rules.

use std::path::{Path, PathBuf};

/// Expands `*` and `?` in each component of `path` against the
/// filesystem, as `Include` lines in ssh_config and sshd_config do (names
/// starting with a dot are left out). Unsorted.
pub fn glob_paths(path: &Path) -> Vec<PathBuf> {
    let mut current = vec![PathBuf::from(if path.is_absolute() { "/" } else { "." })];
    for comp in path.components().skip(usize::from(path.is_absolute())) {
        let part = comp.as_os_str().to_string_lossy();
        let mut next = Vec::new();
        for base in &current {
            if skiff_proto::pattern::has_wildcard(&part) {
                if let Ok(rd) = std::fs::read_dir(base) {
                    for entry in rd.flatten() {
                        let name = entry.file_name().to_string_lossy().into_owned();
                        if !name.starts_with('.')
                            && skiff_proto::pattern::wildcard_match(&part, &name)
                        {
                            next.push(base.join(name));
                        }
                    }
                }
            } else {
                next.push(base.join(&*part));
            }
        }
        current = next;
    }
    current
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wildcards_in_any_component() {
        let dir = tempfile::tempdir().unwrap();
        for p in [
            "a/x.conf",
            "a/y.conf",
            "a/.hidden.conf",
            "b/x.conf",
            "a/z.txt",
        ] {
            let path = dir.path().join(p);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, "").unwrap();
        }
        let mut got = glob_paths(&dir.path().join("*/?.conf"));
        got.sort();
        let want: Vec<PathBuf> = ["a/x.conf", "a/y.conf", "b/x.conf"]
            .iter()
            .map(|p| dir.path().join(p))
            .collect();
        assert_eq!(got, want);
        // A plain path is returned as it is, whether or not it exists.
        let plain = dir.path().join("none/here");
        assert_eq!(glob_paths(&plain), [plain]);
    }
}
