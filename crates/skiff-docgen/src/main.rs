//! `skiff-docgen`: writes the manual page `skiffd_config(5)` from the
//! configuration reference, for packaging/build-deb:
//!
//! ```text
//! skiff-docgen config-page docs/skiffd-config.md OUT/skiffd_config.5
//! ```
//!
//! (The pages of `skiff` and `skiffd` themselves come from their own
//! `--generate-docs DIR`: see the library.)

#![forbid(unsafe_code)]

use std::path::Path;
use std::process::ExitCode;

use skiff_docgen::markdown_man::{render, Page};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    let [_, command, input, output] = args.as_slice() else {
        eprintln!("usage: skiff-docgen config-page REFERENCE.md OUTPUT.5");
        return ExitCode::from(2);
    };
    if command != "config-page" {
        eprintln!("skiff-docgen: unknown command {command:?} (config-page)");
        return ExitCode::from(2);
    }
    match config_page(Path::new(input), Path::new(output)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("skiff-docgen: {e}");
            ExitCode::FAILURE
        }
    }
}

fn config_page(input: &Path, output: &Path) -> Result<(), String> {
    let markdown = std::fs::read_to_string(input)
        .map_err(|e| format!("cannot read {}: {e}", input.display()))?;
    let source = format!("skiff {}", env!("CARGO_PKG_VERSION"));
    let page = Page {
        name: "skiffd_config",
        section: "5",
        summary: "skiffd configuration file",
        source: &source,
        manual: "File Formats",
        synopsis: &["/etc/skiffd/skiffd_config"],
        files: &[
            "/etc/skiffd/skiffd_config: the configuration the packaged skiffd.service reads",
            "/etc/pam.d/skiffd: the PAM service of UsePAM yes (PAMServiceName skiffd)",
        ],
        see_also: &["skiffd(8)", "skiff(1)", "sshd_config(5)", "pam(8)"],
    };
    let text = render(&page, &markdown).map_err(|e| format!("{}: {e}", input.display()))?;
    std::fs::write(output, text).map_err(|e| format!("cannot write {}: {e}", output.display()))
}
