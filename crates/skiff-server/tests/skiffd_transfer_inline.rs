//! skiffd's transfer process against a client that writes the data
//! plane's control frames itself (version 2: an upload on the channel
//! alone), through a stock OpenSSH `ssh -s transfer@skiff`: a well-formed
//! upload is stored as sent; bytes for an entry not announced before them,
//! or past an entry's size, end the transfer with the server's reason and
//! leave nothing behind, neither under the final name nor as a temporary;
//! a download asks for streams it must have, unless (version 3) it offered
//! to take a small download on the channel, which then comes whole behind
//! a `Welcome` with no token; and a `Hello` of a version skiffd does not
//! speak, or without streams before version 2, is refused.

use std::fs;
use std::io::{Read, Write};
use std::path::Path;
use std::process::Stdio;
use std::sync::mpsc;
use std::time::Duration;

use skiff_proto::dataplane::{self as dp, ClientMsg, EntryWire, InlineLimits, Mode, ServerMsg};
use skiff_testkit::server_context as ctx;
use skiff_testkit::*;

fn skiffd(fx: &Fixture) -> Skiffd {
    let config = transfer_subsystem_config().unwrap_or_default();
    Skiffd::start_with(SkiffdOptions::new(&fx.host_key, &fx.authorized_keys).config(&config))
}

/// How long one exchange may take: a hang fails the test.
const LIMIT: Duration = Duration::from_secs(60);

/// Sends `msgs` as the client's side of one `transfer@skiff` channel and
/// returns what the server answered, frame by frame, up to its last word
/// (`Done` or `Refused`) or the channel's end. The client's side stays
/// open until then, as skiff's does: the transfer process takes the end of
/// its input for the client leaving.
fn exchange(d: &Skiffd, fx: &Fixture, msgs: &[ClientMsg]) -> Vec<ServerMsg> {
    let mut child = ssh_command(d.port(), user(), &fx.client_key)
        .args(["-s", "transfer@skiff"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start ssh");
    let pid = child.id();
    let (done_tx, done_rx) = mpsc::channel::<()>();
    let watchdog = std::thread::spawn(move || {
        if done_rx.recv_timeout(LIMIT).is_err() {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid as i32),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    });
    let mut stdin = child.stdin.take().expect("ssh's stdin");
    let bytes: Vec<u8> = msgs.iter().flat_map(dp::encode_client).collect();
    let _ = stdin.write_all(&bytes);
    let mut stdout = child.stdout.take().expect("ssh's stdout");
    let (mut got, mut buf) = (Vec::new(), Vec::new());
    loop {
        got.extend(take_frames(&mut buf, d));
        if got
            .iter()
            .any(|m| matches!(m, ServerMsg::Done | ServerMsg::Refused { .. }))
        {
            break;
        }
        let mut chunk = [0u8; 16 * 1024];
        match stdout.read(&mut chunk) {
            Ok(0) | Err(_) => break,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
    drop(stdin);
    let _ = child.wait();
    let _ = done_tx.send(());
    let _ = watchdog.join();
    assert!(
        buf.is_empty(),
        "{}",
        ctx(d, &format!("a cut frame after {got:?}"))
    );
    got
}

/// The server's whole frames at the front of `buf`, taken out of it; a
/// malformed one fails the test.
fn take_frames(buf: &mut Vec<u8>, d: &Skiffd) -> Vec<ServerMsg> {
    let mut got = Vec::new();
    while let Some((msg, used)) = dp::decode_server(buf)
        .unwrap_or_else(|e| panic!("{e}: {}", ctx(d, &format!("server frames {got:?}"))))
    {
        buf.drain(..used);
        got.push(msg);
    }
    got
}

fn hello(version: u32, streams: u32) -> ClientMsg {
    ClientMsg::Hello {
        version,
        mode: Mode::Aead,
        streams,
        secret: [4; dp::SECRET_LEN],
    }
}

fn put(target: &Path, sources: u32) -> ClientMsg {
    ClientMsg::Put {
        target: target.display().to_string(),
        sources,
        recursive: false,
        preserve: false,
        streams: 0,
    }
}

fn entry(id: u32, name: &str, size: u64) -> ClientMsg {
    ClientMsg::Entry(EntryWire {
        id,
        rel: name.into(),
        size,
        mode: 0o640,
        ..EntryWire::default()
    })
}

fn data(id: u32, offset: u64, bytes: &[u8]) -> ClientMsg {
    ClientMsg::Data {
        id,
        offset,
        bytes: bytes.to_vec(),
    }
}

/// What is in `dir`, by name.
fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

#[test]
fn an_upload_on_the_channel_alone_is_stored_as_sent() {
    if !require_openssh() {
        return;
    }
    let fx = Fixture::new();
    let d = skiffd(&fx);
    let rdir = account_dir();
    let target = rdir.path().join("f");
    let got = exchange(
        &d,
        &fx,
        &[
            hello(2, 0),
            put(&target, 1),
            entry(0, "f", 11),
            data(0, 6, b"world"),
            data(0, 0, b"hello "),
            ClientMsg::PutEnd,
        ],
    );
    let [ServerMsg::Welcome {
        version: 2,
        mode: Mode::Aead,
        tokens,
        ..
    }, ServerMsg::Ready, ServerMsg::Stored { id: 0 }, ServerMsg::Done] = got.as_slice()
    else {
        panic!("{got:?}\n{}", ctx(&d, "inline upload"));
    };
    assert!(tokens.is_empty(), "no stream, no token: {tokens:?}");
    assert_eq!(fs::read(&target).unwrap(), b"hello world");
    assert_eq!(names(rdir.path()), ["f"]);
}

/// A client that closes its side of the channel once it has sent the
/// whole upload (`ssh -s` at the end of its input) still gets every file
/// stored and its `Done`: on the channel alone, every byte is in by then.
#[test]
fn an_upload_whose_client_closed_its_side_after_sending_is_still_stored() {
    if !require_openssh() {
        return;
    }
    let fx = Fixture::new();
    let d = skiffd(&fx);
    let rdir = account_dir();
    let names_sent: Vec<String> = (0..6).map(|i| format!("f{i}")).collect();
    let mut msgs = vec![hello(2, 0), put(rdir.path(), names_sent.len() as u32)];
    for (id, name) in names_sent.iter().enumerate() {
        msgs.push(entry(id as u32, name, 4));
        msgs.push(data(id as u32, 0, b"four"));
    }
    msgs.push(ClientMsg::PutEnd);
    let bytes: Vec<u8> = msgs.iter().flat_map(dp::encode_client).collect();
    let out = ssh(d.port(), user(), &fx.client_key)
        .flag("-s")
        .args(&["transfer@skiff"])
        .input(Input::Bytes(bytes))
        .timeout(LIMIT)
        .run();
    let mut rest = out.stdout.clone();
    let got = take_frames(&mut rest, &d);
    assert!(rest.is_empty(), "a cut frame after {got:?}\n{out}");
    let stored = got
        .iter()
        .filter(|m| matches!(m, ServerMsg::Stored { .. }))
        .count();
    assert_eq!(
        stored,
        names_sent.len(),
        "{got:?}\n{}",
        ctx(&d, "closed side")
    );
    assert!(matches!(got.last(), Some(ServerMsg::Done)), "{got:?}");
    assert_eq!(names(rdir.path()), names_sent);
    for name in &names_sent {
        assert_eq!(fs::read(rdir.path().join(name)).unwrap(), b"four");
    }
}

/// Bytes for an entry announced after them, and bytes past an entry's
/// size: the transfer ends, the server says why, and nothing of it is
/// left in the target directory.
#[test]
fn bytes_the_client_had_no_right_to_send_end_the_transfer_and_leave_nothing() {
    if !require_openssh() {
        return;
    }
    let fx = Fixture::new();
    let d = skiffd(&fx);
    let cases: [(&str, Vec<ClientMsg>); 2] = [
        (
            "not announced",
            vec![data(0, 0, b"early"), entry(0, "f", 5)],
        ),
        (
            "past the announced size",
            vec![entry(0, "f", 5), data(0, 3, b"xyz")],
        ),
    ];
    for (why, middle) in cases {
        let rdir = account_dir();
        let mut msgs = vec![hello(2, 0), put(&rdir.path().join("f"), 1)];
        msgs.extend(middle);
        msgs.push(ClientMsg::PutEnd);
        let got = exchange(&d, &fx, &msgs);
        let reason = got.iter().find_map(|m| match m {
            ServerMsg::Failed {
                id: u32::MAX,
                message,
            } => Some(message.as_str()),
            _ => None,
        });
        assert!(
            reason.is_some_and(|r| r.contains(why)),
            "{why}: {got:?}\n{}",
            ctx(&d, why)
        );
        assert!(
            !got.iter().any(|m| matches!(m, ServerMsg::Stored { .. })),
            "{why}: {got:?}"
        );
        assert!(
            names(rdir.path()).is_empty(),
            "{why}: left {:?}",
            names(rdir.path())
        );
    }
}

#[test]
fn a_download_without_streams_is_refused() {
    if !require_openssh() {
        return;
    }
    let fx = Fixture::new();
    let d = skiffd(&fx);
    let got = exchange(
        &d,
        &fx,
        &[hello(2, 0), get(Path::new("/etc/hostname"), 0, None)],
    );
    assert!(
        matches!(
            got.as_slice(),
            [ServerMsg::Welcome { .. }, ServerMsg::Failed { id: u32::MAX, message }, ServerMsg::Done]
                if message.contains("needs a data stream")
        ),
        "{got:?}\n{}",
        ctx(&d, "download without streams")
    );
}

/// A download of `source` on `streams` streams, offering the channel up
/// to `inline`.
fn get(source: &Path, streams: u32, inline: Option<InlineLimits>) -> ClientMsg {
    ClientMsg::Get {
        sources: vec![source.display().to_string()],
        recursive: false,
        preserve: false,
        streams,
        inline,
    }
}

/// A download on two streams that offers the channel up to `bytes`.
fn get_offering(source: &Path, bytes: u64) -> ClientMsg {
    get(source, 2, Some(InlineLimits { bytes, entries: 64 }))
}

/// A version-3 download that offered to take a small download on the
/// channel gets it there, whole, behind a `Welcome` that grants no stream:
/// the entry, its bytes in order in `Data` messages of at most a chunk,
/// then `Done`. One that allows fewer bytes than the file holds, or one
/// larger than the server reads ahead of time, gets its streams.
#[test]
fn a_small_download_comes_back_on_the_channel_when_offered() {
    if !require_openssh() {
        return;
    }
    let fx = Fixture::new();
    let d = skiffd(&fx);
    let rdir = account_dir();
    let src = rdir.path().join("f");
    random_file(&src, 100_000);
    std::os::unix::fs::chown(&src, Some(account().uid), Some(account().gid)).unwrap();

    let got = exchange(&d, &fx, &[hello(3, 2), get_offering(&src, 1 << 20)]);
    let c = ctx(&d, "small download on the channel");
    let [ServerMsg::Welcome {
        version: 3, tokens, ..
    }, ServerMsg::Entry(e), rest @ .., ServerMsg::Done] = got.as_slice()
    else {
        panic!(
            "{got:?}
{c}"
        );
    };
    assert!(
        tokens.is_empty(),
        "{tokens:?}
{c}"
    );
    assert_eq!((e.id, e.rel.as_str(), e.size), (0, "f", 100_000), "{c}");
    let mut bytes = Vec::new();
    for m in rest {
        let ServerMsg::Data {
            id: 0,
            offset,
            bytes: b,
        } = m
        else {
            panic!(
                "{m:?} among the file's bytes
{c}"
            );
        };
        assert_eq!(*offset, bytes.len() as u64, "{c}");
        assert!(b.len() <= dp::INLINE_CHUNK, "{c}");
        bytes.extend_from_slice(b);
    }
    assert!(rest.len() >= 2, "100 000 bytes take two messages: {rest:?}");
    assert!(bytes == fs::read(&src).unwrap(), "the bytes differ\n{c}");

    // Fewer bytes offered than the file holds; or more than the server
    // reads ahead of time (1 MiB), whatever the client offered.
    let big = rdir.path().join("big");
    random_file(&big, (1 << 20) + 1);
    std::os::unix::fs::chown(&big, Some(account().uid), Some(account().gid)).unwrap();
    for (source, offer) in [(&src, 99_999), (&big, 64 << 20)] {
        let got = exchange(&d, &fx, &[hello(3, 2), get_offering(source, offer)]);
        assert!(
            matches!(
                got.as_slice(),
                [ServerMsg::Welcome { version: 3, tokens, .. }, ServerMsg::Entry(_), ServerMsg::Done]
                    if tokens.len() == 2
            ),
            "{got:?}\n{}",
            ctx(&d, &format!("{} offered {offer}", source.display()))
        );
    }
}

/// Inline limits in a request under a version-2 `Hello` break the
/// protocol: the transfer ends without sending a byte of the file.
#[test]
fn an_offer_under_an_older_hello_ends_the_transfer() {
    if !require_openssh() {
        return;
    }
    let fx = Fixture::new();
    let d = skiffd(&fx);
    let got = exchange(
        &d,
        &fx,
        &[
            hello(2, 2),
            get_offering(Path::new("/etc/hostname"), 1 << 20),
        ],
    );
    assert!(
        matches!(got.as_slice(), [ServerMsg::Welcome { version: 2, .. }]),
        "{got:?}
{}",
        ctx(&d, "offer under version 2")
    );
}

/// Version 1 never had uploads without streams, and a version skiffd does
/// not know is refused before anything else happens.
#[test]
fn a_hello_skiffd_cannot_serve_is_refused() {
    if !require_openssh() {
        return;
    }
    let fx = Fixture::new();
    let d = skiffd(&fx);
    let rdir = account_dir();
    for (version, streams) in [(1, 0), (0, 2), (dp::VERSION + 1, 2)] {
        let got = exchange(
            &d,
            &fx,
            &[
                hello(version, streams),
                put(&rdir.path().join("f"), 1),
                entry(0, "f", 1),
                data(0, 0, b"x"),
                ClientMsg::PutEnd,
            ],
        );
        assert!(
            matches!(got.as_slice(), [ServerMsg::Refused { .. }]),
            "version {version}, {streams} streams: {got:?}\n{}",
            ctx(&d, "refused hello")
        );
    }
    assert!(names(rdir.path()).is_empty(), "{:?}", names(rdir.path()));
}
