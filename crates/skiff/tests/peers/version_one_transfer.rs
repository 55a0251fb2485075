//! A test peer: the data plane's transfer process as a skiffd from before
//! version 2 of the data plane ran it, for `tests/cp_inline.rs`, which
//! proves that `skiff cp` still copies to such a server.
//!
//! skiffd runs it as its transfer process (`Subsystem transfer@skiff
//! 'PATH' SKIFFD LOG` in its config). It reads the client's `Hello` and
//! appends its version to LOG, one line per `Hello`. A version other than
//! 1 gets the refusal such a skiffd sent, and the process ends. Version 1
//! is served by the real transfer process (`SKIFFD --transfer-server`),
//! which gets what was read with the `Hello` and then the rest of the
//! channel, and fd 3 (the socket to skiffd) as this process got it.

use std::fs::OpenOptions;
use std::io::{self, Read, Write};
use std::process::{Command, Stdio};

use anyhow::{bail, Context, Result};
use skiff_proto::dataplane::{self as dp, ClientMsg, ServerMsg};

fn main() {
    if let Err(e) = run() {
        eprintln!("version_one_transfer: {e:#}");
        std::process::exit(1);
    }
}

fn run() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [skiffd, log] = args.as_slice() else {
        bail!("usage: version_one_transfer SKIFFD LOG");
    };
    let mut stdin = io::stdin().lock();
    // Read until `Hello` is whole; whatever came with it goes on too.
    let mut read = Vec::new();
    let first = loop {
        if let Some((msg, _)) = dp::decode_client(&read)? {
            break msg;
        }
        let mut chunk = [0u8; 64 * 1024];
        match stdin.read(&mut chunk)? {
            0 => bail!("the channel ended before Hello"),
            n => read.extend_from_slice(&chunk[..n]),
        }
    };
    let ClientMsg::Hello { version, .. } = first else {
        bail!("the client did not start with Hello");
    };
    let mut seen = OpenOptions::new()
        .append(true)
        .create(true)
        .open(log)
        .with_context(|| format!("opening {log}"))?;
    writeln!(seen, "{version}")?;
    if version != 1 {
        let refusal = dp::encode_server(&ServerMsg::Refused {
            reason: format!("data plane version {version} is not supported (this skiffd speaks 1)"),
        });
        let mut out = io::stdout().lock();
        out.write_all(&refusal)?;
        out.flush()?;
        return Ok(());
    }
    let mut child = Command::new(skiffd)
        .arg("--transfer-server")
        .stdin(Stdio::piped())
        .spawn()
        .with_context(|| format!("starting {skiffd} --transfer-server"))?;
    let mut to_child = child.stdin.take().context("the child's stdin")?;
    to_child.write_all(&read)?;
    // The rest of the channel, as it comes; the child sees its end when
    // the client's input ends.
    let _ = io::copy(&mut stdin, &mut to_child);
    drop(to_child);
    let status = child.wait()?;
    std::process::exit(status.code().unwrap_or(1));
}
