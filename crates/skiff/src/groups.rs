//! Groups for `@name` in node sets (`skiff run`, `skiff cp` to or from a
//! node set): `--groups FILE`, else the default groups file
//! (`$XDG_CONFIG_HOME/skiff/groups`, else `~/.config/skiff/groups`) when
//! it exists. Lines are `name: nodeset`.

use std::path::PathBuf;

use clap::Args;
use skiff_proto::nodeset;

#[derive(Args, Debug, Clone, Default)]
pub struct GroupsArgs {
    /// Groups file for @name in a node set (default: $XDG_CONFIG_HOME/skiff/groups, else ~/.config/skiff/groups).
    #[arg(long = "groups", value_name = "FILE")]
    pub file: Option<PathBuf>,
}

impl GroupsArgs {
    /// The groups: from `--groups`, else from the default file when it
    /// exists (none when it does not).
    pub fn load(&self) -> Result<nodeset::Groups, String> {
        let (path, explicit) = match &self.file {
            Some(p) => (p.clone(), true),
            None => (default_path(), false),
        };
        match std::fs::read_to_string(&path) {
            Ok(text) => nodeset::parse_groups_file(&text, &path.display().to_string())
                .map_err(|e| e.to_string()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && !explicit => {
                Ok(nodeset::Groups::default())
            }
            Err(e) => Err(format!("cannot read {}: {e}", path.display())),
        }
    }
}

fn default_path() -> PathBuf {
    std::env::var_os("XDG_CONFIG_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| skiff_engine::settings::home_dir().join(".config"))
        .join("skiff/groups")
}
