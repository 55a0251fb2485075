//! Both ends of the data plane, joined over loopback TCP in one process:
//! the sending side as the client runs it for an upload and the transfer
//! process for a download (`offer_tree` and the queue's senders), and the
//! receiving side as each runs it (`Accepting` and the file table's
//! receivers), with the control channel an in-process queue. Then the
//! receiving side against a hostile sender (entries not asked for, names
//! that leave the target, an id announced twice, forged records, a stream
//! cut in the middle of a file) and the sending side against a file that
//! shrinks while it is sent. Whatever fails, nothing half-written is left
//! under a final name and no temporary stays behind.

use std::net::{TcpListener, TcpStream};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, SystemTime};

use skiff_dataplane::stream::CHUNK_DATA;
use skiff_dataplane::{
    offer_tree, Accepted, Accepting, ChunkQueue, FileTable, Misbehaved, Offered, RecordReader,
    RecordWriter, Settled, StreamError,
};
use skiff_files::{Requested, Why, TEMP_MARKER};
use skiff_proto::dataplane::{derive_keys, EntryWire, Keys, Mode, Side};

fn keys(seed: u8) -> Keys {
    derive_keys(&[seed; 32], &[seed ^ 0x5a; 32], Mode::Aead)
}

/// `n` streams over loopback TCP: the sender's writers sealing with
/// `sender_keys`, the receiver's readers opening with `receiver_keys`.
fn streams(
    sender_keys: &Keys,
    receiver_keys: &Keys,
    n: u32,
) -> (Vec<RecordWriter>, Vec<RecordReader>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let mut writers = Vec::new();
    let mut readers = Vec::new();
    for i in 0..n {
        let tx = TcpStream::connect(addr).unwrap();
        let (rx, _) = listener.accept().unwrap();
        // A test that goes wrong fails instead of hanging.
        rx.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        writers.push(RecordWriter::new(
            tx,
            sender_keys,
            Side::Client,
            Mode::Aead,
            i,
        ));
        readers.push(RecordReader::new(
            rx,
            receiver_keys,
            Side::Client,
            Mode::Aead,
            i,
        ));
    }
    (writers, readers)
}

/// Which side receives.
enum Role {
    /// skiffd's end of an upload.
    Upload,
    /// The client's end of a download of these sources (as typed).
    Download(Vec<String>, bool),
}

/// What the receiving side saw.
#[derive(Default)]
struct Received {
    accepted: Vec<Result<Accepted, Misbehaved>>,
    settled: Vec<String>,
    stream_errors: Vec<StreamError>,
    incomplete: Vec<String>,
    dir_failures: Vec<String>,
}

/// Runs the receiving side into `target` for `sources` sources: one thread
/// per stream, announcements taken as they come until the sender is done
/// or one breaks the protocol (which aborts the transfer, as both real
/// receivers do).
fn receive(
    target: &Path,
    sources: usize,
    role: Role,
    preserve: bool,
    announcements: mpsc::Receiver<EntryWire>,
    readers: Vec<RecordReader>,
) -> Received {
    let placement = skiff_files::resolve_target(target, sources).unwrap();
    let settled = Arc::new(Mutex::new(Vec::new()));
    let table = {
        let settled = settled.clone();
        FileTable::new(move |s| {
            settled.lock().unwrap().push(match s {
                Settled::Stored(id) => format!("stored {id}"),
                Settled::Failed(id, why) => format!("failed {id}: {why}"),
            })
        })
    };
    let receivers: Vec<_> = readers
        .into_iter()
        .map(|r| {
            let table = table.clone();
            std::thread::spawn(move || table.run_receiver(r, &|_| {}))
        })
        .collect();
    let mut accepting = match role {
        Role::Upload => Accepting::upload(&table, &placement, preserve),
        Role::Download(sources, recursive) => Accepting::download(
            &table,
            &placement,
            preserve,
            Requested::new(&sources, recursive),
        ),
    };
    let mut out = Received::default();
    for e in announcements {
        let taken = accepting.entry(&e);
        let broke = taken.is_err();
        out.accepted.push(taken);
        if broke {
            table.abort();
            break;
        }
    }
    table.close_announcements();
    for r in receivers {
        if let Err(e) = r.join().unwrap() {
            out.stream_errors.push(e);
        }
    }
    out.incomplete = table.incomplete();
    table.wait_settled();
    out.dir_failures = accepting.finish();
    out.settled = std::mem::take(&mut *settled.lock().unwrap());
    out.settled.sort();
    out
}

/// What the sending side saw.
struct Sent {
    unsendable: Vec<String>,
    read_failures: Vec<u32>,
    stream_errors: Vec<String>,
}

/// Runs the sending side: walks `sources`, announces each entry on
/// `announcements`, sends the chunks over the writers. `on_announce` runs
/// after each announcement, before the file's chunks are queued.
fn send(
    sources: Vec<PathBuf>,
    recursive: bool,
    writers: Vec<RecordWriter>,
    announcements: mpsc::Sender<EntryWire>,
    on_announce: impl Fn(&EntryWire, &Path) + Send + 'static,
) -> std::thread::JoinHandle<Sent> {
    std::thread::spawn(move || {
        // A small queue, so the walk waits on the senders as it would for
        // a large tree.
        let queue = ChunkQueue::new(4);
        let read_failures = Arc::new(Mutex::new(Vec::new()));
        let senders: Vec<_> = writers
            .into_iter()
            .map(|w| {
                let (queue, read_failures) = (queue.clone(), read_failures.clone());
                std::thread::spawn(move || {
                    let failed =
                        |id: u32, _e: std::io::Error| read_failures.lock().unwrap().push(id);
                    queue.run_sender(w, &|_| {}, &failed)
                })
            })
            .collect();
        let mut unsendable = Vec::new();
        offer_tree(&sources, recursive, &queue, &mut |offered| match offered {
            Offered::Entry { wire, source } => {
                let taken = announcements.send(wire.clone()).is_ok();
                on_announce(&wire, &source);
                taken
            }
            Offered::Unsendable(why) => {
                unsendable.push(why);
                true
            }
        });
        drop(announcements);
        let stream_errors = senders
            .into_iter()
            .filter_map(|s| s.join().unwrap().err())
            .map(|e| e.to_string())
            .collect();
        let read_failures = read_failures.lock().unwrap().clone();
        Sent {
            unsendable,
            read_failures,
            stream_errors,
        }
    })
}

/// Bytes that differ from chunk to chunk, so a chunk written at the wrong
/// offset shows.
fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u32).wrapping_mul(31).wrapping_add(seed as u32) as u8)
        .collect()
}

fn set_mtime(path: &Path, secs: u64) {
    let f = std::fs::File::options().read(true).open(path).unwrap();
    let t = SystemTime::UNIX_EPOCH + Duration::from_secs(secs);
    f.set_times(std::fs::FileTimes::new().set_modified(t).set_accessed(t))
        .unwrap();
}

fn mode_of(path: &Path) -> u32 {
    std::fs::metadata(path).unwrap().mode() & 0o7777
}

/// Every path under `dir`, relative, sorted; temporaries included.
fn listing(dir: &Path) -> Vec<String> {
    fn walk(root: &Path, dir: &Path, out: &mut Vec<String>) {
        for e in std::fs::read_dir(dir).unwrap() {
            let e = e.unwrap();
            let path = e.path();
            out.push(path.strip_prefix(root).unwrap().display().to_string());
            if e.file_type().unwrap().is_dir() {
                walk(root, &path, out);
            }
        }
    }
    let mut out = Vec::new();
    walk(dir, dir, &mut out);
    out.sort();
    out
}

fn assert_no_temporaries(dir: &Path) {
    let left: Vec<_> = listing(dir)
        .into_iter()
        .filter(|p| p.contains(TEMP_MARKER))
        .collect();
    assert!(left.is_empty(), "temporaries left: {left:?}");
}

/// A source tree: `t/` (0750) holding a file of several chunks, an empty
/// file, and `sub/small` (0600); every mtime set.
fn source_tree(root: &Path) -> (PathBuf, Vec<u8>) {
    let t = root.join("t");
    std::fs::create_dir_all(t.join("sub")).unwrap();
    let big = pattern(3 * CHUNK_DATA + 123, 1);
    std::fs::write(t.join("big"), &big).unwrap();
    std::fs::write(t.join("empty"), b"").unwrap();
    std::fs::write(t.join("sub/small"), b"small file").unwrap();
    std::fs::set_permissions(t.join("sub/small"), std::fs::Permissions::from_mode(0o600)).unwrap();
    for (p, secs) in [
        ("big", 1_000_000),
        ("empty", 1_100_000),
        ("sub/small", 1_200_000),
        ("sub", 1_300_000),
    ] {
        set_mtime(&t.join(p), secs);
    }
    std::fs::set_permissions(&t, std::fs::Permissions::from_mode(0o750)).unwrap();
    set_mtime(&t, 1_400_000);
    (t, big)
}

fn mtime_of(path: &Path) -> i64 {
    std::fs::metadata(path).unwrap().mtime()
}

#[test]
fn an_upload_arrives_whole_over_several_streams_with_modes_and_times() {
    let src = tempfile::tempdir().unwrap();
    let dst = tempfile::tempdir().unwrap();
    let (tree, big) = source_tree(src.path());
    let k = keys(1);
    let (writers, readers) = streams(&k, &k, 3);
    let (tx, rx) = mpsc::channel();
    let sender = send(vec![tree], true, writers, tx, |_, _| {});
    let got = receive(dst.path(), 1, Role::Upload, true, rx, readers);
    let sent = sender.join().unwrap();
    assert!(
        sent.unsendable.is_empty() && sent.read_failures.is_empty(),
        "{:?}",
        sent.unsendable
    );
    assert!(sent.stream_errors.is_empty(), "{:?}", sent.stream_errors);
    assert!(got.stream_errors.is_empty(), "{:?}", got.stream_errors);
    assert!(got.incomplete.is_empty() && got.dir_failures.is_empty());
    // Ids: t 0, t/big 1, t/empty 2, t/sub 3, t/sub/small 4.
    assert_eq!(got.settled, ["stored 1", "stored 2", "stored 4"]);
    let t = dst.path().join("t");
    assert_eq!(std::fs::read(t.join("big")).unwrap(), big);
    assert_eq!(std::fs::read(t.join("empty")).unwrap(), b"");
    assert_eq!(std::fs::read(t.join("sub/small")).unwrap(), b"small file");
    assert_eq!(mode_of(&t.join("sub/small")), 0o600);
    assert_eq!(mode_of(&t), 0o750);
    assert_eq!(mtime_of(&t.join("big")), 1_000_000);
    assert_eq!(mtime_of(&t.join("sub")), 1_300_000);
    assert_eq!(mtime_of(&t), 1_400_000);
    assert_no_temporaries(dst.path());
}

#[test]
fn a_download_keeps_what_was_asked_for_and_drops_set_id_bits() {
    let src = tempfile::tempdir().unwrap();
    let dst = tempfile::tempdir().unwrap();
    let file = src.path().join("tool");
    std::fs::write(&file, b"#!/bin/sh\n").unwrap();
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o4755)).unwrap();
    let k = keys(2);
    let (writers, readers) = streams(&k, &k, 2);
    let (tx, rx) = mpsc::channel();
    let asked = vec![file.display().to_string()];
    let sender = send(vec![file], false, writers, tx, |_, _| {});
    let got = receive(
        dst.path(),
        1,
        Role::Download(asked, false),
        true,
        rx,
        readers,
    );
    sender.join().unwrap();
    assert!(got.stream_errors.is_empty(), "{:?}", got.stream_errors);
    assert_eq!(got.settled, ["stored 0"]);
    assert_eq!(
        std::fs::read(dst.path().join("tool")).unwrap(),
        b"#!/bin/sh\n"
    );
    // The server may not hand the client a set-uid file.
    assert_eq!(mode_of(&dst.path().join("tool")), 0o755);
}

/// A sender that writes whatever it likes: announcements, then records.
struct Hostile {
    announcements: mpsc::Sender<EntryWire>,
    writer: RecordWriter,
    bytes: std::fs::File,
    _dir: tempfile::TempDir,
}

impl Hostile {
    fn new(announcements: mpsc::Sender<EntryWire>, writer: RecordWriter) -> Hostile {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("bytes");
        std::fs::write(&path, pattern(2 * CHUNK_DATA, 9)).unwrap();
        Hostile {
            announcements,
            writer,
            bytes: std::fs::File::open(path).unwrap(),
            _dir: dir,
        }
    }

    fn announce(&self, id: u32, rel: &str, is_dir: bool, size: u64) {
        let e = EntryWire {
            id,
            rel: rel.into(),
            is_dir,
            size,
            mode: 0o644,
            ..EntryWire::default()
        };
        // The receiver may already have stopped listening.
        let _ = self.announcements.send(e);
    }

    /// Sends a chunk; once the receiver has given up, writes fail, and
    /// that is not the sender's concern here.
    fn chunk(&mut self, id: u32, offset: u64, len: usize) {
        let _ = self.writer.send_chunk(id, &self.bytes, offset, len);
    }

    /// The stream's end record (see `chunk`).
    fn end(&mut self) {
        let _ = self.writer.send_end();
    }
}

/// A hostile sender on one stream; `script` plays it, then the receiving
/// side's outcome is returned once the sender is gone.
fn against_hostile(
    role: Role,
    target: &Path,
    sender_keys: &Keys,
    script: impl FnOnce(&mut Hostile) + Send + 'static,
) -> Received {
    let (writers, readers) = streams(sender_keys, &keys(3), 1);
    let (tx, rx) = mpsc::channel();
    let writer = writers.into_iter().next().unwrap();
    let sender = std::thread::spawn(move || {
        let mut h = Hostile::new(tx, writer);
        script(&mut h);
        // Dropping it closes the control queue and the stream.
    });
    let got = receive(target, 1, role, false, rx, readers);
    sender.join().unwrap();
    got
}

#[test]
fn a_download_entry_not_asked_for_ends_the_transfer_and_makes_nothing() {
    let dst = tempfile::tempdir().unwrap();
    let got = against_hostile(
        Role::Download(vec!["wanted".into()], false),
        dst.path(),
        &keys(3),
        |h| {
            h.announce(0, ".bashrc", false, 5);
            h.chunk(0, 0, 5);
            h.end();
        },
    );
    let refused = got.accepted.last().unwrap().as_ref().unwrap_err();
    match refused {
        Misbehaved::Unrequested(u) => assert_eq!(u.why, Why::NotASource, "{u}"),
        other => panic!("{other:?}"),
    }
    assert!(listing(dst.path()).is_empty(), "{:?}", listing(dst.path()));
}

#[test]
fn a_download_directory_where_a_file_was_asked_for_ends_the_transfer() {
    let dst = tempfile::tempdir().unwrap();
    let got = against_hostile(
        Role::Download(vec!["/srv/wanted".into()], false),
        dst.path(),
        &keys(3),
        |h| h.announce(0, "wanted", true, 0),
    );
    match got.accepted.last().unwrap() {
        Err(Misbehaved::Unrequested(u)) => assert_eq!(u.why, Why::DirectoryWithoutRecursive),
        other => panic!("{other:?}"),
    }
    assert!(listing(dst.path()).is_empty(), "{:?}", listing(dst.path()));
}

#[test]
fn an_upload_name_that_leaves_the_target_fails_alone() {
    let outer = tempfile::tempdir().unwrap();
    let dst = outer.path().join("target");
    std::fs::create_dir(&dst).unwrap();
    let got = against_hostile(Role::Upload, &dst, &keys(3), |h| {
        h.announce(0, "../escaped", false, 5);
        h.announce(1, "/etc/escaped", false, 5);
        h.announce(2, "kept", false, 5);
        for id in 0..3 {
            h.chunk(id, 0, 5);
        }
        h.end();
    });
    assert!(
        matches!(got.accepted[0], Ok(Accepted::Failed(_))),
        "{:?}",
        got.accepted[0]
    );
    assert!(
        matches!(got.accepted[1], Ok(Accepted::Failed(_))),
        "{:?}",
        got.accepted[1]
    );
    assert!(
        matches!(got.accepted[2], Ok(Accepted::File(5, _))),
        "{:?}",
        got.accepted[2]
    );
    // The refused entries' chunks were discarded, the transfer went on.
    assert!(got.stream_errors.is_empty(), "{:?}", got.stream_errors);
    assert_eq!(got.settled, ["stored 2"]);
    assert_eq!(listing(outer.path()), ["target", "target/kept"]);
}

#[test]
fn an_id_announced_twice_ends_the_transfer_and_leaves_nothing() {
    for role in [
        Role::Upload,
        Role::Download(vec!["a".into(), "b".into()], false),
    ] {
        let dst = tempfile::tempdir().unwrap();
        let got = against_hostile(role, dst.path(), &keys(3), |h| {
            h.announce(0, "a", false, 10);
            h.chunk(0, 0, 5);
            h.announce(0, "b", false, 10);
            // The stream ends cleanly: the second announcement is what
            // ends the transfer.
            h.end();
        });
        assert!(matches!(got.accepted[0], Ok(Accepted::File(10, _))));
        assert_eq!(
            got.accepted[1].as_ref().unwrap_err(),
            &Misbehaved::AnnouncedTwice(skiff_dataplane::AnnouncedTwice(0))
        );
        assert!(listing(dst.path()).is_empty(), "{:?}", listing(dst.path()));
    }
}

#[test]
fn a_forged_record_ends_the_transfer_and_leaves_nothing() {
    let dst = tempfile::tempdir().unwrap();
    // Records sealed under keys the receiver does not hold.
    let got = against_hostile(Role::Upload, dst.path(), &keys(4), |h| {
        h.announce(0, "f", false, 5);
        h.chunk(0, 0, 5);
        h.end();
    });
    assert_eq!(got.stream_errors.len(), 1);
    assert!(
        got.stream_errors[0].is_integrity(),
        "{}",
        got.stream_errors[0]
    );
    assert!(got.settled.is_empty(), "{:?}", got.settled);
    assert!(listing(dst.path()).is_empty(), "{:?}", listing(dst.path()));
}

#[test]
fn a_stream_cut_in_the_middle_of_a_file_fails_it_and_leaves_nothing() {
    let dst = tempfile::tempdir().unwrap();
    let got = against_hostile(Role::Upload, dst.path(), &keys(3), |h| {
        h.announce(0, "whole", false, 5);
        h.announce(1, "cut", false, 2 * CHUNK_DATA as u64);
        h.chunk(0, 0, 5);
        h.chunk(1, 0, CHUNK_DATA);
        // No second chunk and no end record: the connection just closes.
    });
    assert_eq!(got.stream_errors.len(), 1, "{:?}", got.stream_errors);
    assert!(!got.stream_errors[0].is_consequence());
    // The complete file was committed before the cut; the cut one is gone.
    assert_eq!(got.settled, ["stored 0"]);
    assert_eq!(listing(dst.path()), ["whole"]);
}

#[test]
fn a_stream_that_ends_before_a_file_is_complete_leaves_it_out() {
    let dst = tempfile::tempdir().unwrap();
    let got = against_hostile(Role::Upload, dst.path(), &keys(3), |h| {
        h.announce(0, "short", false, 10);
        h.chunk(0, 0, 4);
        h.end();
    });
    assert!(got.stream_errors.is_empty(), "{:?}", got.stream_errors);
    assert_eq!(got.incomplete.len(), 1, "{:?}", got.incomplete);
    assert!(
        got.incomplete[0].ends_with("short (4 of 10 bytes)"),
        "{:?}",
        got.incomplete
    );
    assert!(listing(dst.path()).is_empty(), "{:?}", listing(dst.path()));
}

#[test]
fn a_file_that_shrinks_while_it_is_sent_fails_alone() {
    let src = tempfile::tempdir().unwrap();
    let dst = tempfile::tempdir().unwrap();
    for (name, len) in [("a", 100), ("shrinks", 2 * CHUNK_DATA), ("z", 7)] {
        std::fs::write(src.path().join(name), pattern(len, 5)).unwrap();
    }
    let sources: Vec<_> = ["a", "shrinks", "z"]
        .iter()
        .map(|n| src.path().join(n))
        .collect();
    let k = keys(5);
    let (writers, readers) = streams(&k, &k, 2);
    let (tx, rx) = mpsc::channel();
    // Cut to a few bytes once announced at its full size, before its chunks
    // are read.
    let sender = send(sources, false, writers, tx, |wire, source| {
        if wire.rel == "shrinks" {
            std::fs::File::options()
                .write(true)
                .open(source)
                .unwrap()
                .set_len(10)
                .unwrap();
        }
    });
    let got = receive(dst.path(), 3, Role::Upload, false, rx, readers);
    let sent = sender.join().unwrap();
    assert_eq!(sent.read_failures, [1]);
    assert!(sent.stream_errors.is_empty(), "{:?}", sent.stream_errors);
    assert!(got.stream_errors.is_empty(), "{:?}", got.stream_errors);
    assert_eq!(got.settled, ["stored 0", "stored 2"]);
    assert_eq!(got.incomplete.len(), 1, "{:?}", got.incomplete);
    assert_eq!(listing(dst.path()), ["a", "z"]);
    assert_eq!(std::fs::read(dst.path().join("z")).unwrap(), pattern(7, 5));
}
