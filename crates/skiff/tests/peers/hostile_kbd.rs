//! A test peer used as a `ProxyCommand`: `hostile_kbd HOST_KEY` is an SSH
//! server on its stdin and stdout that takes keyboard-interactive only and
//! asks questions laced with terminal control sequences (cursor moves,
//! line erasure, an OSC 52 clipboard write), refusing every answer, so a
//! test can check what the client shows of them.

use std::borrow::Cow;
use std::sync::Arc;

use russh::server::{Auth, Config, Handler, Response};
use russh::{MethodKind, MethodSet};

/// The request's name, instruction and prompts (prompt, echo).
pub const NAME: &str = "Hostile\u{1b}[1A";
pub const INSTRUCTION: &str = "Read this\u{1b}]52;c;aGk=\u{7} now\u{1b}[2K\rfake line";
pub const PROMPT: &str = "Code\u{1b}[2K\r: ";

struct Server;

impl Handler for Server {
    type Error = russh::Error;

    async fn auth_keyboard_interactive<'a>(
        &'a mut self,
        _user: &str,
        _submethods: &str,
        response: Option<Response<'a>>,
    ) -> Result<Auth, Self::Error> {
        if response.is_some() {
            return Ok(Auth::Reject {
                proceed_with_methods: Some(MethodSet::from(&[MethodKind::KeyboardInteractive][..])),
                partial_success: false,
            });
        }
        Ok(Auth::Partial {
            name: Cow::Borrowed(NAME),
            instructions: Cow::Borrowed(INSTRUCTION),
            prompts: Cow::Owned(vec![(Cow::Borrowed(PROMPT), true)]),
        })
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let Some(key_path) = std::env::args().nth(1) else {
        eprintln!("usage: hostile_kbd HOST_KEY");
        std::process::exit(2);
    };
    let key = russh::keys::load_secret_key(&key_path, None).expect("read the host key");
    let config = Config {
        keys: vec![key],
        methods: MethodSet::from(&[MethodKind::KeyboardInteractive][..]),
        auth_rejection_time: std::time::Duration::from_millis(10),
        auth_rejection_time_initial: Some(std::time::Duration::ZERO),
        ..Default::default()
    };
    let stream = tokio::io::join(tokio::io::stdin(), tokio::io::stdout());
    let session = russh::server::run_stream(Arc::new(config), stream, Server)
        .await
        .expect("start the session");
    let _ = session.await;
}
