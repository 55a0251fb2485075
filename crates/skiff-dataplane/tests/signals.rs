//! A stream's setup is not failed by a signal. A read with a timeout (as a
//! stream's reads are, until its acknowledgement) is never restarted after
//! a signal, whatever the handler's flags, nor after the process was
//! stopped and continued (Ctrl-Z and `fg` during a copy): it ends with
//! `EINTR` and must be made again. Here a handler for SIGUSR1 that does
//! nothing plays the signal, sent to the client's thread alone while it
//! waits for the server's identification line and acknowledgement. (Its
//! own test binary: the handler is the process's.)

use std::io::{Read, Write};
use std::net::TcpListener;
use std::sync::mpsc;
use std::thread;
use std::time::Duration;

use nix::sys::pthread::{pthread_kill, pthread_self};
use nix::sys::signal::{sigaction, SaFlags, SigAction, SigHandler, SigSet, Signal};
use skiff_dataplane::stream::dial;
use skiff_dataplane::RecordWriter;
use skiff_proto::dataplane::{derive_keys, Mode, Side, MAGIC, TOKEN_LEN};

extern "C" fn nothing(_: libc::c_int) {}

/// Sends SIGUSR1 to `thread` `times` times, 10 ms apart.
fn interrupt(thread: nix::sys::pthread::Pthread, times: u32) {
    for _ in 0..times {
        // The thread may have ended (the test then fails on its result).
        let _ = pthread_kill(thread, Signal::SIGUSR1);
        thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn a_stream_waiting_for_its_acknowledgement_goes_on_through_signals() {
    let handler = SigAction::new(
        SigHandler::Handler(nothing),
        SaFlags::empty(),
        SigSet::empty(),
    );
    // SAFETY: the handler does nothing, so it is safe in any context; it
    // is installed for SIGUSR1, which nothing else in this test binary uses.
    unsafe { sigaction(Signal::SIGUSR1, &handler) }.expect("install the handler");

    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("address");
    let keys = || derive_keys(&[1; 32], &[2; 32], Mode::Aead);
    let (tell, told) = mpsc::channel();
    let client = thread::spawn(move || {
        tell.send(pthread_self()).expect("tell the thread");
        let dialed = dial(addr, 0)?;
        dialed
            .present(&[7; TOKEN_LEN], &keys(), Mode::Aead)
            .map(|_| ())
    });
    let client_thread = told.recv().expect("the client's thread");
    let (mut server, _) = listener.accept().expect("accept");
    server
        .set_read_timeout(Some(Duration::from_secs(60)))
        .expect("timeout");
    let mut hello = [0u8; MAGIC.len() + TOKEN_LEN];
    server.read_exact(&mut hello).expect("magic and token");
    assert_eq!(&hello[..MAGIC.len()], &MAGIC);

    // The client now waits for the identification line, then for the
    // acknowledgement record: signals cut its reads short, again and again.
    interrupt(client_thread, 20);
    server
        .write_all(b"SSH-2.0-skiffd_test\r\n")
        .expect("identification");
    interrupt(client_thread, 10);
    let mut writer = RecordWriter::new(server, &keys(), Side::Server, Mode::Aead, 0);
    let acknowledged = writer.send_ack();
    client
        .join()
        .expect("the client's thread")
        .expect("the stream is acknowledged");
    acknowledged.expect("the acknowledgement went out");
}
