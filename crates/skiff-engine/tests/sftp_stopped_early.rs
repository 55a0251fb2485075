//! An SFTP upload stopped (its future dropped, as Ctrl-C does) before the
//! server's `VERSION` reached skiff still has its temporary removed by
//! [`Temporaries::remove_all`] over the same session.
//!
//! skiff sends its first requests in the same flight as `INIT` (see
//! `copy::sftp`), so the server can create the temporary before skiff has
//! read `VERSION`. The server here is OpenSSH's real `sftp-server`, run as
//! a child on pipes; what it sends is held back until the copy has been
//! dropped, then let through: `VERSION` arrives after the copy is gone.
//! The SFTP client ends a session that receives a `VERSION` nobody waits
//! for, so this fails if the negotiation dies with the copy.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use skiff_engine::copy::sftp::copy_on;
use skiff_engine::copy::{CopyJob, Direction, NoProgress, Temporaries};
use skiff_engine::ServerKind;
use tokio::io::AsyncWriteExt;
use tokio::sync::oneshot;

/// Longest any wait here takes (a loaded machine is slow, not stuck).
const PATIENCE: Duration = Duration::from_secs(60);

/// Large and sparse: the upload is nowhere near done when it is stopped.
const BIG: u64 = 256 * 1024 * 1024;

/// The names in `dir` that look like skiff's temporaries.
fn temporaries(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .expect("read the target directory")
        .map(|e| e.expect("a directory entry").file_name())
        .map(|n| n.to_string_lossy().into_owned())
        .filter(|n| n.contains(".skiff-"))
        .collect()
}

/// OpenSSH's `sftp-server` on pipes, behind a tokio duplex whose client
/// end is returned. What the client writes reaches the server at once;
/// what the server writes is held until `release` fires (or is dropped).
fn held_back_server(
    sftp_server: &str,
    release: oneshot::Receiver<()>,
) -> (tokio::io::DuplexStream, tokio::process::Child) {
    let mut child = tokio::process::Command::new(sftp_server)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .expect("start sftp-server");
    let mut to_server = child.stdin.take().expect("stdin piped");
    let mut from_server = child.stdout.take().expect("stdout piped");
    let (client, relay) = tokio::io::duplex(1 << 20);
    let (mut relay_rd, mut relay_wr) = tokio::io::split(relay);
    tokio::spawn(async move {
        let _ = tokio::io::copy(&mut relay_rd, &mut to_server).await;
        let _ = to_server.shutdown().await;
    });
    tokio::spawn(async move {
        let _ = release.await;
        let _ = tokio::io::copy(&mut from_server, &mut relay_wr).await;
    });
    (client, child)
}

/// A sparse file of `size` bytes in `dir`.
fn sparse_source(dir: &Path, size: u64) -> PathBuf {
    let path = dir.join("big");
    let f = std::fs::File::create(&path).expect("create the source");
    f.set_len(size).expect("size the source");
    path
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upload_stopped_before_version_came_still_removes_its_temporary() {
    let Some(sftp_server) = skiff_testkit::openssh_sftp_server() else {
        return;
    };
    let scratch = tempfile::tempdir().expect("scratch directory");
    let source = sparse_source(scratch.path(), BIG);
    let target_dir = scratch.path().join("target");
    std::fs::create_dir(&target_dir).expect("target directory");
    let (release, released) = oneshot::channel();
    let (stream, mut server) = held_back_server(sftp_server, released);

    let job = CopyJob {
        direction: Direction::Upload {
            sources: vec![source],
            target: target_dir.join("big").to_string_lossy().into_owned(),
        },
        recursive: false,
        preserve: false,
    };
    let temps = Temporaries::new();
    let copying = copy_on(
        stream,
        "local",
        ServerKind::OpenSsh,
        &job,
        None,
        None,
        Some(1),
        &NoProgress,
        &temps,
    );
    // The server creates the temporary (the request went out with
    // `INIT`) while nothing it answered has reached the copy yet.
    let appeared = async {
        while temporaries(&target_dir).is_empty() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    tokio::select! {
        ended = copying => panic!("the copy ended though the server's answers were held: {ended:?}"),
        _ = tokio::time::timeout(PATIENCE, appeared) => {}
    }
    // The copy future is dropped here, as a signal would drop it.
    assert_eq!(
        temporaries(&target_dir).len(),
        1,
        "the server created the temporary before the copy was stopped"
    );
    assert_eq!(temps.len(), 1, "the copy registered its temporary");

    // Now `VERSION`, and the rest, reach the session.
    release.send(()).expect("the relay waits");
    let cleanup = tokio::time::timeout(PATIENCE, temps.remove_all())
        .await
        .expect("the clean-up ends");
    assert!(cleanup.left.is_empty(), "left behind: {:?}", cleanup.left);
    assert_eq!(cleanup.removed, 1);
    assert!(
        temporaries(&target_dir).is_empty(),
        "temporaries on disk: {:?}",
        temporaries(&target_dir)
    );
    assert!(
        !target_dir.join("big").exists(),
        "nothing under the final name"
    );

    // The session is closed once its temporaries are dealt with: the
    // server sees its input end and exits.
    let status = tokio::time::timeout(PATIENCE, server.wait())
        .await
        .expect("sftp-server exits once the session is closed")
        .expect("wait for sftp-server");
    assert!(status.success(), "sftp-server: {status}");
}
