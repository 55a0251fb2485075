//! `skiff cp`: what to copy (a [`CopyJob`]), how progress is reported, and
//! what came of it (a [`CopyReport`]), whatever backend carries the bytes.
//! The skiff data plane ([`dataplane`]) is used where the server offers it,
//! the SFTP backend ([`sftp`]) with any other SSH server: [`copy`] decides,
//! and [`sftp_fallback_notice`] says what the user is told when it falls
//! back. Local files are walked, placed and written with `skiff_files`.
//! The remote temporaries of an SFTP upload in progress are kept in
//! [`Temporaries`], which removes them after a copy that was stopped.

pub mod dataplane;
pub mod leftovers;
pub mod read_ahead;
pub mod sftp;
pub mod sftp_channels;
mod watchdog;

use std::path::PathBuf;
use std::time::Duration;

use skiff_proto::terminal_text;

use crate::error::{ErrorKind, SkiffError};

pub use leftovers::{Cleanup, Temporaries};

/// Which way the files go, and between which paths.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Direction {
    /// Local sources to a remote target path as typed (relative to the
    /// remote login directory unless absolute; empty means that directory).
    Upload {
        sources: Vec<PathBuf>,
        target: String,
    },
    /// Remote sources (as typed, relative to the login directory unless
    /// absolute) to a local target.
    Download {
        sources: Vec<String>,
        target: PathBuf,
    },
}

/// One `skiff cp` invocation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CopyJob {
    pub direction: Direction,
    /// `-r`: copy directories and their contents.
    pub recursive: bool,
    /// `-p`: keep modes (exactly) and access/modification times.
    pub preserve: bool,
}

impl CopyJob {
    /// This job for the host labelled `label`, one of a node set: a
    /// download goes into `TARGET/NAME`, `NAME` being the label as one file
    /// name that no other label shares, so that the hosts' files stay apart
    /// (and a host named `..` writes nowhere else).
    pub fn for_host(&self, label: &str) -> CopyJob {
        let mut job = self.clone();
        if let Direction::Download { target, .. } = &mut job.direction {
            *target = target.join(skiff_files::label_file_name(label));
        }
        job
    }
}

/// Copies `job` on `conn` over the skiff data plane when the server offers
/// one, else over SFTP; `notice` gets the line the user should see when
/// the fallback weakens what was asked for ([`sftp_fallback_notice`]).
/// An SFTP upload's temporaries are in `temps` while they are written:
/// after stopping the copy unfinished, remove them with
/// [`Temporaries::remove_all`].
pub async fn copy(
    conn: &crate::Connection,
    job: &CopyJob,
    options: &dataplane::PlaneOptions,
    progress: &dyn Progress,
    notice: &(dyn Fn(&str) + Sync),
    temps: &Temporaries,
) -> Result<CopyReport, SkiffError> {
    if let Some(report) = dataplane::copy(conn, job, options, progress).await? {
        return Ok(report);
    }
    tracing::debug!(
        "{}: no skiff data plane; using SFTP",
        conn.settings.hostname
    );
    if let Some(line) = sftp_fallback_notice(&conn.settings.original_host, options.mode) {
        notice(&line);
    }
    let channels = options.streams.map(|n| n as usize);
    sftp::copy(conn, job, channels, progress, temps).await
}

/// What the user is told when `host` has no skiff data plane and a copy
/// that asked for data-plane `mode` goes over SFTP instead: nothing for the
/// default (`aead`, encrypted either way); for `integrity` or `none`, that
/// the copy is encrypted after all (and so slower than asked).
pub fn sftp_fallback_notice(host: &str, mode: skiff_proto::dataplane::Mode) -> Option<String> {
    (mode != skiff_proto::dataplane::Mode::Aead)
        .then(|| format!("{host} has no skiff data plane; copying over SFTP (encrypted)"))
}

/// Receives progress while a copy runs (a progress bar, or nothing).
pub trait Progress: Send + Sync {
    /// More bytes are going to be copied (called as sources are found).
    fn add_total(&self, bytes: u64);
    /// This many more bytes have been copied.
    fn advance(&self, bytes: u64);
    /// A file is complete under its final name (`path` as shown to the user).
    fn file_done(&self, path: &str);
}

/// A [`Progress`] that shows nothing.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoProgress;

impl Progress for NoProgress {
    fn add_total(&self, _bytes: u64) {}
    fn advance(&self, _bytes: u64) {}
    fn file_done(&self, _path: &str) {}
}

/// What a copy did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CopyReport {
    /// Files copied completely.
    pub files: u64,
    /// Directories created (or found in place) for copied trees.
    pub dirs: u64,
    /// Bytes of file data copied.
    pub bytes: u64,
    /// One human line per failed file or directory, naming the path.
    pub failures: Vec<String>,
}

/// The server broke the protocol (an entry not asked for, an id announced
/// twice, more bytes than asked for): the copy ends.
pub(crate) fn misbehaved(host: &str, what: impl std::fmt::Display) -> SkiffError {
    let message = format!("{host}: {what}; the copy was stopped");
    SkiffError::new(
        ErrorKind::Protocol,
        terminal_text::one_line(&message).into_owned(),
    )
}

/// The copy went `idle` without a byte moving or a message arriving.
pub(crate) fn stalled(host: &str, idle: Duration) -> SkiffError {
    SkiffError::new(
        ErrorKind::Connect,
        format!(
            "{}: the transfer made no progress for {} s (ServerAliveInterval × ServerAliveCountMax); giving up, files not complete were not written",
            terminal_text::one_line(host),
            idle.as_secs()
        ),
    )
}

/// A report's failures quote the server's words and names it chose: they
/// leave the engine made safe to show.
pub(crate) fn safe_report(mut report: CopyReport) -> CopyReport {
    for f in &mut report.failures {
        if !terminal_text::is_plain(f) {
            *f = terminal_text::one_line(f).into_owned();
        }
    }
    report
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_host_downloads_into_a_directory_of_its_own() {
        let job = CopyJob {
            direction: Direction::Download {
                sources: vec!["f".into()],
                target: "out".into(),
            },
            recursive: false,
            preserve: false,
        };
        let target = |label: &str| match job.for_host(label).direction {
            Direction::Download { target, .. } => target,
            other => panic!("{other:?}"),
        };
        assert_eq!(target("web01"), std::path::Path::new("out/web01"));
        assert_eq!(target(".."), std::path::Path::new("out/%2E%2E"));
        assert_eq!(target("."), std::path::Path::new("out/%2E"));
        assert_eq!(target("a/b"), std::path::Path::new("out/a%2Fb"));
    }
}
