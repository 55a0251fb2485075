//! skiff's manual pages and shell completions, made for packaging
//! (packaging/build-deb): `skiff(1)` with a page per subcommand and
//! `skiffd(8)` from the binaries' clap definitions ([`write_cli_docs`],
//! reached through the hidden `--generate-docs DIR` that both binaries
//! take as their only argument, see [`generate_if_asked`]), completions
//! for bash, zsh and fish from the same definitions, and `skiffd_config(5)`
//! from docs/skiffd-config.md ([`markdown_man`], run by this crate's
//! `skiff-docgen` binary).
//!
//! Hidden arguments and subcommands (skiffd's internal `--pam-session`,
//! `--sftp-server`, ...) appear in no page and no completion: both are made
//! from [`visible`], the command without them.

#![forbid(unsafe_code)]

pub mod markdown_man;

use std::ffi::OsString;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use clap::Command;
use clap_complete::Shell;

/// The hidden argument that makes `skiff` and `skiffd` write their manual
/// pages and completions instead of running: `BIN --generate-docs DIR`.
pub const GENERATE_FLAG: &str = "--generate-docs";

/// The shells completions are written for, with the file name each one's
/// Debian location expects for a command `name` (bash-completion: the
/// command's name; zsh: `_name`; fish: `name.fish`).
pub const SHELLS: [(Shell, &str); 3] = [
    (Shell::Bash, "bash"),
    (Shell::Zsh, "zsh"),
    (Shell::Fish, "fish"),
];

/// The file name of `name`'s completion for `shell`.
pub fn completion_file_name(shell: Shell, name: &str) -> String {
    match shell {
        Shell::Zsh => format!("_{name}"),
        Shell::Fish => format!("{name}.fish"),
        _ => name.to_string(),
    }
}

/// When `argv` (the whole command line, program name first) asks for the
/// docs (`BIN --generate-docs DIR`), writes them (see [`write_cli_docs`])
/// and returns the exit status to leave with; otherwise `None`, and the
/// binary goes on parsing its command line as usual. `command` makes the
/// binary's clap command; `section` is its manual section ("1", "8").
pub fn generate_if_asked(
    argv: &[OsString],
    command: impl FnOnce() -> Command,
    section: &str,
) -> Option<i32> {
    if argv.get(1).is_none_or(|a| a != GENERATE_FLAG) {
        return None;
    }
    let code = match argv {
        [_, _, dir] => match write_cli_docs(command(), section, Path::new(dir)) {
            Ok(files) => {
                for file in files {
                    println!("{}", file.display());
                }
                0
            }
            Err(e) => {
                eprintln!("cannot write the manual pages and completions to {dir:?}: {e}");
                1
            }
        },
        _ => {
            eprintln!("usage: {GENERATE_FLAG} DIR");
            2
        }
    };
    Some(code)
}

/// Writes `cmd`'s manual pages into `DIR/man/` (`NAME.SECTION`, and
/// `NAME-SUB.SECTION` for each subcommand, nested ones too) and its
/// completions into `DIR/completions/{bash,zsh,fish}/` under the names
/// [`completion_file_name`] gives, hidden arguments and subcommands left
/// out. Returns the files written.
pub fn write_cli_docs(cmd: Command, section: &str, dir: &Path) -> io::Result<Vec<PathBuf>> {
    let cmd = visible(&cmd);
    let name = cmd.get_name().to_string();
    let mut written = Vec::new();
    let man_dir = dir.join("man");
    fs::create_dir_all(&man_dir)?;
    // Built once from the top, so that each subcommand knows its parents
    // (`skiff exec` in its usage line); no page for clap's `help`.
    let mut pages = cmd.clone().disable_help_subcommand(true);
    pages.build();
    let version = cmd.get_version().map(str::to_string);
    write_pages(&pages, section, version.as_deref(), &man_dir, &mut written)?;
    for (shell, folder) in SHELLS {
        let folder = dir.join("completions").join(folder);
        fs::create_dir_all(&folder)?;
        let path = folder.join(completion_file_name(shell, &name));
        let mut script = Vec::new();
        clap_complete::generate(shell, &mut cmd.clone(), name.clone(), &mut script);
        fs::write(&path, script)?;
        written.push(path);
    }
    Ok(written)
}

/// The page of `cmd` and those of its subcommands, each named after its
/// display name (`skiff-exec` for `skiff exec`).
fn write_pages(
    cmd: &Command,
    section: &str,
    version: Option<&str>,
    dir: &Path,
    written: &mut Vec<PathBuf>,
) -> io::Result<()> {
    for sub in cmd.get_subcommands() {
        write_pages(sub, section, version, dir, written)?;
    }
    let title = cmd.get_display_name().unwrap_or(cmd.get_name()).to_string();
    let mut man = clap_mangen::Man::new(cmd.clone())
        .title(title.to_ascii_uppercase())
        .section(section);
    if let Some(version) = version {
        man = man.source(format!("skiff {version}"));
    }
    let path = dir.join(format!("{title}.{section}"));
    let mut page = Vec::new();
    man.render(&mut page)?;
    fs::write(&path, page)?;
    written.push(path);
    Ok(())
}

/// `cmd` without its hidden arguments and subcommands, at every level,
/// with what the pages and completions show of it (names, texts, version,
/// the settings that change a usage line) kept. Argument groups are left
/// out: clap's derive puts every field, hidden ones too, into one.
pub fn visible(cmd: &Command) -> Command {
    let mut out = Command::new(cmd.get_name().to_string())
        .disable_help_flag(cmd.is_disable_help_flag_set())
        .disable_version_flag(cmd.is_disable_version_flag_set())
        .disable_help_subcommand(cmd.is_disable_help_subcommand_set())
        .subcommand_required(cmd.is_subcommand_required_set())
        .arg_required_else_help(cmd.is_arg_required_else_help_set())
        .args_conflicts_with_subcommands(cmd.is_args_conflicts_with_subcommands_set())
        .allow_missing_positional(cmd.is_allow_missing_positional_set())
        .visible_aliases(
            cmd.get_visible_aliases()
                .map(str::to_string)
                .collect::<Vec<_>>(),
        )
        .args(cmd.get_arguments().filter(|a| !a.is_hide_set()).cloned())
        .subcommands(
            cmd.get_subcommands()
                .filter(|s| !s.is_hide_set())
                .map(visible),
        );
    if let Some(version) = cmd.get_version() {
        out = out.version(version.to_string());
    }
    if let Some(author) = cmd.get_author() {
        out = out.author(author.to_string());
    }
    if let Some(name) = cmd.get_bin_name() {
        out = out.bin_name(name.to_string());
    }
    if let Some(name) = cmd.get_subcommand_value_name() {
        out = out.subcommand_value_name(name.to_string());
    }
    if let Some(about) = cmd.get_about() {
        out = out.about(about.clone());
    }
    if let Some(about) = cmd.get_long_about() {
        out = out.long_about(about.clone());
    }
    if let Some(text) = cmd.get_after_help() {
        out = out.after_help(text.clone());
    }
    if let Some(text) = cmd.get_after_long_help() {
        out = out.after_long_help(text.clone());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{Arg, ArgAction};

    fn sample() -> Command {
        Command::new("tool")
            .version("1.2.3")
            .about("A sample tool")
            .subcommand_required(true)
            .arg(
                Arg::new("secret-mode")
                    .long("secret-mode")
                    .hide(true)
                    .action(ArgAction::SetTrue),
            )
            .arg(
                Arg::new("verbose")
                    .short('v')
                    .long("verbose")
                    .help("More output")
                    .action(ArgAction::Count),
            )
            .subcommand(
                Command::new("run")
                    .about("Run something")
                    .arg(Arg::new("target").required(true).help("Where to run"))
                    .arg(
                        Arg::new("internal-fd")
                            .long("internal-fd")
                            .hide(true)
                            .requires("target"),
                    )
                    .subcommand(Command::new("deep").about("A nested one")),
            )
            .subcommand(Command::new("plumbing").hide(true).about("Internal only"))
    }

    fn read(path: &Path) -> String {
        fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    }

    #[test]
    fn pages_and_completions_leave_hidden_things_out() {
        let dir = tempfile::tempdir().expect("tempdir");
        let files = write_cli_docs(sample(), "1", dir.path()).expect("write");
        let names: Vec<String> = files
            .iter()
            .map(|f| {
                f.strip_prefix(dir.path())
                    .expect("inside")
                    .display()
                    .to_string()
            })
            .collect();
        for expected in [
            "man/tool.1",
            "man/tool-run.1",
            "man/tool-run-deep.1",
            "completions/bash/tool",
            "completions/zsh/_tool",
            "completions/fish/tool.fish",
        ] {
            assert!(
                names.iter().any(|n| n == expected),
                "{expected} in {names:?}"
            );
        }
        assert!(
            !names
                .iter()
                .any(|n| n.contains("plumbing") || n.contains("help")),
            "hidden subcommand or clap's help got a page: {names:?}"
        );
        for file in &files {
            let text = read(file);
            for hidden in ["secret-mode", "internal-fd", "plumbing"] {
                assert!(!text.contains(hidden), "{hidden} in {}", file.display());
            }
        }
        let top = read(&dir.path().join("man/tool.1"));
        assert!(top.contains(".TH TOOL 1"), "{top}");
        assert!(top.contains("skiff 1.2.3"), "{top}");
        assert!(top.contains("More output"), "{top}");
        let run = read(&dir.path().join("man/tool-run.1"));
        assert!(run.contains("tool\\-run"), "{run}");
        assert!(run.contains("tool run"), "usage names the parent: {run}");
        assert!(run.contains("Where to run"), "{run}");
        let bash = read(&dir.path().join("completions/bash/tool"));
        assert!(bash.contains("--verbose") && bash.contains("run"), "{bash}");
        let fish = read(&dir.path().join("completions/fish/tool.fish"));
        assert!(fish.contains("complete -c tool"), "{fish}");
    }

    #[test]
    fn only_the_exact_request_is_taken() {
        let args = |a: &[&str]| a.iter().map(OsString::from).collect::<Vec<_>>();
        let never = || -> Command { panic!("must not build the command") };
        assert_eq!(generate_if_asked(&args(&["tool"]), never, "1"), None);
        assert_eq!(
            generate_if_asked(&args(&["tool", "run", "--generate-docs"]), never, "1"),
            None
        );
        assert_eq!(
            generate_if_asked(&args(&["tool", GENERATE_FLAG]), never, "1"),
            Some(2)
        );
        let dir = tempfile::tempdir().expect("tempdir");
        let out = dir.path().join("out");
        let argv = vec![
            OsString::from("tool"),
            OsString::from(GENERATE_FLAG),
            out.clone().into_os_string(),
        ];
        assert_eq!(generate_if_asked(&argv, sample, "8"), Some(0));
        assert!(out.join("man/tool.8").is_file());
        assert!(out.join("man/tool-run.8").is_file());
    }

    #[test]
    fn the_visible_command_still_parses_like_the_original() {
        let cmd = visible(&sample());
        let m = cmd
            .clone()
            .try_get_matches_from(["tool", "-vv", "run", "here"])
            .expect("parses");
        assert_eq!(m.get_count("verbose"), 2);
        assert!(cmd
            .clone()
            .try_get_matches_from(["tool", "--secret-mode", "run", "x"])
            .is_err());
        assert!(
            cmd.try_get_matches_from(["tool"]).is_err(),
            "subcommand still required"
        );
    }
}
