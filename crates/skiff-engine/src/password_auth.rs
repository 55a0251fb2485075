//! Password and keyboard-interactive user authentication, tried after (or,
//! per `PreferredAuthentications`, before) public keys: the password asked
//! as "USER@HOST's password: " on the terminal (echo off) or through
//! SSH_ASKPASS, keyboard-interactive prompts shown as the server sends them
//! (its words escaped, so a hostile server cannot steer the terminal), up
//! to `NumberOfPasswordPrompts` tries. Nobody is asked under BatchMode (so
//! never by skiff's agent, which runs BatchMode: it hands the command back
//! to the CLI, as for a key's passphrase) nor in a fan-out (not yet). A
//! password is zeroized once sent and never logged.
//!
//! The policy (method order, who may be asked, where a question goes) is
//! free of I/O and tested here; [`crate::identity::authenticate`] runs the
//! methods in order.

use std::io::{BufRead, Write};

use russh::client::{AuthResult, Handle, Handler, KeyboardInteractiveAuthResponse};
use russh::MethodKind;
use zeroize::Zeroizing;

use crate::error::{ErrorKind, SkiffError};
use crate::settings::ConnectSettings;

/// A user-authentication method skiff can use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AuthMethod {
    PublicKey,
    KeyboardInteractive,
    Password,
}

impl AuthMethod {
    /// The method's SSH name.
    pub fn name(self) -> &'static str {
        match self {
            AuthMethod::PublicKey => "publickey",
            AuthMethod::KeyboardInteractive => "keyboard-interactive",
            AuthMethod::Password => "password",
        }
    }

    pub(crate) fn kind(self) -> MethodKind {
        match self {
            AuthMethod::PublicKey => MethodKind::PublicKey,
            AuthMethod::KeyboardInteractive => MethodKind::KeyboardInteractive,
            AuthMethod::Password => MethodKind::Password,
        }
    }

    fn from_name(name: &str) -> Option<Self> {
        [
            AuthMethod::PublicKey,
            AuthMethod::KeyboardInteractive,
            AuthMethod::Password,
        ]
        .into_iter()
        .find(|m| m.name() == name)
    }
}

/// ssh's default order, without the GSSAPI skiff does not have.
pub const DEFAULT_ORDER: [AuthMethod; 3] = [
    AuthMethod::PublicKey,
    AuthMethod::KeyboardInteractive,
    AuthMethod::Password,
];

/// The methods to try, in `PreferredAuthentications` order (`None`: ssh's
/// default), each once; names skiff does not implement (`hostbased`,
/// `gssapi-with-mic`) are passed over, as ssh passes over names it does
/// not know.
pub fn method_order(preferred: Option<&[String]>) -> Vec<AuthMethod> {
    let Some(names) = preferred else {
        return DEFAULT_ORDER.to_vec();
    };
    let mut order = Vec::new();
    for m in names.iter().filter_map(|n| AuthMethod::from_name(n)) {
        if !order.contains(&m) {
            order.push(m);
        }
    }
    order
}

/// Who may be asked for a password (or keyboard-interactive answers) on a
/// connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Asking {
    /// A person, on the terminal or through SSH_ASKPASS.
    Person,
    /// Nobody: BatchMode (skiff's agent always runs so).
    BatchMode,
    /// A person, once for all the hosts of a fan-out (`skiff run`, `skiff
    /// cp` to many hosts): one password per user name, tried on every host
    /// that asks for one; a keyboard-interactive request other than one
    /// hidden prompt fails that host.
    FanOut,
}

pub(crate) fn asking(batch_mode: bool, fan_out: bool) -> Asking {
    if batch_mode {
        Asking::BatchMode
    } else if fan_out {
        Asking::FanOut
    } else {
        Asking::Person
    }
}

impl Asking {
    /// Why nobody was asked, for the error.
    pub(crate) fn why_not(self) -> Option<&'static str> {
        match self {
            Asking::Person | Asking::FanOut => None,
            Asking::BatchMode => Some("BatchMode is on, so nobody is asked for a password"),
        }
    }
}

/// Whether a question goes to SSH_ASKPASS rather than the terminal, as ssh
/// decides: `SSH_ASKPASS_REQUIRE=never` never, `force` always (when an
/// askpass program is set), `prefer` when one is set; otherwise only
/// without a terminal and with a display.
pub(crate) fn use_askpass(
    askpass_set: bool,
    require: &str,
    has_tty: bool,
    has_display: bool,
) -> bool {
    match require {
        "never" => false,
        "force" | "prefer" => askpass_set,
        _ => askpass_set && !has_tty && has_display,
    }
}

/// Asks a person `prompt` (already safe to show) and returns the answer,
/// zeroized when dropped: through SSH_ASKPASS (see [`use_askpass`]), else
/// on the terminal, echoing what is typed only when `echo`.
pub(crate) fn ask(prompt: &str, echo: bool) -> std::io::Result<Zeroizing<String>> {
    let askpass = std::env::var_os("SSH_ASKPASS").filter(|v| !v.is_empty());
    let require = std::env::var("SSH_ASKPASS_REQUIRE").unwrap_or_default();
    let has_tty = std::fs::File::open("/dev/tty").is_ok();
    let has_display = std::env::var_os("DISPLAY").is_some();
    if use_askpass(askpass.is_some(), &require, has_tty, has_display) {
        let program = askpass.expect("use_askpass needs it set");
        let out = std::process::Command::new(&program)
            .arg(prompt)
            .stdin(std::process::Stdio::null())
            .stderr(std::process::Stdio::inherit())
            .output()?;
        let mut stdout = Zeroizing::new(out.stdout);
        if !out.status.success() {
            return Err(std::io::Error::other(
                "askpass program failed or was cancelled",
            ));
        }
        while matches!(stdout.last(), Some(b'\n' | b'\r')) {
            stdout.pop();
        }
        return match String::from_utf8(std::mem::take(&mut *stdout)) {
            Ok(text) => Ok(Zeroizing::new(text)),
            Err(e) => {
                drop(Zeroizing::new(e.into_bytes()));
                Err(std::io::Error::other(
                    "askpass program's answer is not UTF-8",
                ))
            }
        };
    }
    if !has_tty {
        return Err(std::io::Error::other("no terminal and no SSH_ASKPASS"));
    }
    if !echo {
        return rpassword::prompt_password(prompt).map(Zeroizing::new);
    }
    let mut tty = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/tty")?;
    tty.write_all(prompt.as_bytes())?;
    tty.flush()?;
    let mut line = Zeroizing::new(String::new());
    std::io::BufReader::new(tty).read_line(&mut line)?;
    while line.ends_with('\n') || line.ends_with('\r') {
        line.pop();
    }
    Ok(line)
}

/// A keyboard-interactive request as it is shown: its name and
/// instruction (those not empty, each maybe several lines), then each
/// prompt on one line with whether to echo its answer, all escaped so that
/// the server's words cannot steer the terminal.
fn shown_request(
    name: &str,
    instructions: &str,
    prompts: &[russh::client::Prompt],
) -> (Vec<String>, Vec<(String, bool)>) {
    let text = [name, instructions]
        .into_iter()
        .map(|t| t.trim_end_matches('\n'))
        .filter(|t| !t.is_empty())
        .map(|t| skiff_proto::terminal_text::lines(t).into_owned())
        .collect();
    let prompts = prompts
        .iter()
        .map(|p| {
            let shown = skiff_proto::terminal_text::one_line(&p.prompt);
            (shown.into_owned(), p.echo)
        })
        .collect();
    (text, prompts)
}

/// Shows `shown`, already escaped, on stderr (as ssh shows it), beside
/// the questions that follow.
fn show_server_text(shown: &str) {
    eprintln!("{shown}");
}

/// How one method's run ended.
pub(crate) enum Outcome {
    /// Logged in.
    Success,
    /// Not logged in: the server's last answer (remaining methods, partial
    /// success) and a note for the summary.
    Failed {
        answer: Option<(russh::MethodSet, bool)>,
        note: String,
    },
}

fn lost(settings: &ConnectSettings, e: russh::Error) -> SkiffError {
    SkiffError::new(
        ErrorKind::Connect,
        format!(
            "{}: connection lost during authentication: {e}",
            settings.hostname
        ),
    )
}

/// One question at a time across the connections of this process.
fn one_question_at_a_time<R>(ask: impl FnOnce() -> R) -> R {
    static ASKING: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one = ASKING.lock().unwrap_or_else(|p| p.into_inner());
    crate::prompt_screen::while_prompting(ask)
}

/// Asks on a blocking thread, so that the connection's tasks go on.
async fn ask_blocking(prompt: String, echo: bool) -> std::io::Result<Zeroizing<String>> {
    tokio::task::spawn_blocking(move || one_question_at_a_time(|| ask(&prompt, echo)))
        .await
        .unwrap_or_else(|e| Err(std::io::Error::other(format!("asking failed: {e}"))))
}

/// The cache a fan-out's connections share its one password through;
/// `None` for a connection of its own, which asks for itself.
fn fan_out_cache(
    settings: &ConnectSettings,
) -> Option<&std::sync::Arc<crate::identity_cache::IdentityCache>> {
    settings
        .identity_cache
        .as_ref()
        .filter(|_| settings.fan_out)
}

/// In a fan-out, the password asked for once for every host (by the first
/// connection that needs it, its waiting kept off the fan-out's deadlines);
/// `None` for a connection of its own.
async fn fan_out_password(
    settings: &ConnectSettings,
) -> Option<Result<std::sync::Arc<Zeroizing<String>>, SkiffError>> {
    let cache = fan_out_cache(settings)?;
    let prompt = skiff_proto::terminal_text::one_line(&format!(
        "{}'s password (asked once, for every host that asks): ",
        settings.user
    ))
    .into_owned();
    let clock = cache.clone();
    let shared = cache
        .password(&settings.user, || async move {
            tokio::task::spawn_blocking(move || {
                let _waiting = clock.person().waiting();
                one_question_at_a_time(|| ask(&prompt, false))
            })
            .await
            .unwrap_or_else(|e| Err(std::io::Error::other(format!("asking failed: {e}"))))
            .map(std::sync::Arc::new)
            .map_err(|e| e.to_string())
        })
        .await;
    Some(shared.map_err(|e| {
        SkiffError::new(
            ErrorKind::Auth,
            format!(
                "{}@{}: a password is needed and none could be read: {e}",
                settings.user, settings.hostname
            ),
        )
    }))
}

/// `password` authentication: asks "USER@HOST's password: " up to
/// `NumberOfPasswordPrompts` times while the server still takes passwords.
pub(crate) async fn password<H: Handler>(
    handle: &mut Handle<H>,
    settings: &ConnectSettings,
) -> Result<Outcome, SkiffError> {
    let prompt = skiff_proto::terminal_text::one_line(&format!(
        "{}@{}'s password: ",
        settings.user, settings.hostname
    ))
    .into_owned();
    if let Some(shared) = fan_out_password(settings).await {
        // Once per host: a host that refuses it fails, nobody is asked again.
        let shared = shared?;
        let result = handle
            .authenticate_password(&settings.user, shared.as_str())
            .await;
        return Ok(match result.map_err(|e| lost(settings, e))? {
            AuthResult::Success => Outcome::Success,
            AuthResult::Failure {
                remaining_methods,
                partial_success,
            } => Outcome::Failed {
                answer: Some((remaining_methods, partial_success)),
                note: match partial_success {
                    true => String::new(),
                    false => "the password given for every host was refused".to_string(),
                },
            },
        });
    }
    let mut answer = None;
    let mut refused = 0;
    for _ in 0..settings.number_of_password_prompts {
        let password = ask_blocking(prompt.clone(), false).await.map_err(|e| {
            SkiffError::new(
                ErrorKind::Auth,
                format!(
                    "{}@{}: a password is needed and none could be read: {e}",
                    settings.user, settings.hostname
                ),
            )
        })?;
        // russh zeroizes its copy of the request once sent.
        let result = handle
            .authenticate_password(&settings.user, password.as_str())
            .await;
        drop(password);
        match result.map_err(|e| lost(settings, e))? {
            AuthResult::Success => return Ok(Outcome::Success),
            AuthResult::Failure {
                remaining_methods,
                partial_success,
            } => {
                let goes_on = remaining_methods.contains(&MethodKind::Password);
                answer = Some((remaining_methods, partial_success));
                if partial_success {
                    return Ok(Outcome::Failed {
                        answer,
                        note: String::new(),
                    });
                }
                refused += 1;
                if !goes_on {
                    break;
                }
                if refused < settings.number_of_password_prompts {
                    eprintln!("Permission denied, please try again.");
                }
            }
        }
    }
    Ok(Outcome::Failed {
        answer,
        note: format!("password refused {}", times(refused)),
    })
}

fn times(n: u32) -> String {
    match n {
        1 => "once".to_string(),
        n => format!("{n} times"),
    }
}

/// `keyboard-interactive` authentication: each request's name and
/// instruction shown, each prompt asked (echoed as the server says), up to
/// `NumberOfPasswordPrompts` requests with prompts.
pub(crate) async fn keyboard_interactive<H: Handler>(
    handle: &mut Handle<H>,
    settings: &ConnectSettings,
) -> Result<Outcome, SkiffError> {
    let mut answer = None;
    let mut rounds = 0;
    let mut refused = 0;
    let most = settings.number_of_password_prompts;
    'attempts: while rounds < most && refused < most {
        let mut reply = handle
            .authenticate_keyboard_interactive_start(&settings.user, None)
            .await
            .map_err(|e| lost(settings, e))?;
        loop {
            match reply {
                KeyboardInteractiveAuthResponse::Success => return Ok(Outcome::Success),
                KeyboardInteractiveAuthResponse::Failure {
                    remaining_methods,
                    partial_success,
                } => {
                    let goes_on = remaining_methods.contains(&MethodKind::KeyboardInteractive);
                    answer = Some((remaining_methods, partial_success));
                    if partial_success {
                        return Ok(Outcome::Failed {
                            answer,
                            note: String::new(),
                        });
                    }
                    refused += 1;
                    // A fan-out's password is tried once per host.
                    let once = fan_out_cache(settings).is_some();
                    if !goes_on || once {
                        break 'attempts;
                    }
                    if rounds < settings.number_of_password_prompts {
                        eprintln!("Permission denied, please try again.");
                    }
                    continue 'attempts;
                }
                KeyboardInteractiveAuthResponse::InfoRequest {
                    name,
                    instructions,
                    prompts,
                } => {
                    let mut responses = Vec::with_capacity(prompts.len());
                    if fan_out_cache(settings).is_some() && !prompts.is_empty() {
                        // A fan-out answers one hidden prompt, with the
                        // password asked once; a host's own questions fail it.
                        if rounds >= 1 || prompts.len() != 1 || prompts[0].echo {
                            let (_, asked) = shown_request(&name, &instructions, &prompts);
                            let asked: Vec<String> = asked.into_iter().map(|(p, _)| p).collect();
                            return Ok(Outcome::Failed {
                                answer,
                                note: format!(
                                    "keyboard-interactive asks {:?}, which a fan-out answers only when it is one hidden prompt, the first",
                                    asked
                                ),
                            });
                        }
                        rounds += 1;
                        let shared = fan_out_password(settings).await.expect("a fan-out")?;
                        responses.push(String::clone(&shared));
                    } else if !prompts.is_empty() {
                        if rounds >= settings.number_of_password_prompts {
                            break 'attempts;
                        }
                        rounds += 1;
                        let (text, texts) = shown_request(&name, &instructions, &prompts);
                        let asked = tokio::task::spawn_blocking(move || {
                            one_question_at_a_time(|| {
                                for t in &text {
                                    show_server_text(t);
                                }
                                let mut answers = Vec::new();
                                for (prompt, echo) in &texts {
                                    answers.push(ask(prompt, *echo)?);
                                }
                                Ok::<_, std::io::Error>(answers)
                            })
                        })
                        .await
                        .unwrap_or_else(|e| {
                            Err(std::io::Error::other(format!("asking failed: {e}")))
                        })
                        .map_err(|e| {
                            SkiffError::new(
                                ErrorKind::Auth,
                                format!(
                                    "{}@{}: the server asks questions (keyboard-interactive) and no answer could be read: {e}",
                                    settings.user, settings.hostname
                                ),
                            )
                        })?;
                        // Handed over without a copy: russh sends them.
                        responses.extend(asked.into_iter().map(|mut a| std::mem::take(&mut *a)));
                    }
                    let sent = handle
                        .authenticate_keyboard_interactive_respond(responses)
                        .await;
                    reply = sent.map_err(|e| lost(settings, e))?;
                }
            }
        }
    }
    Ok(Outcome::Failed {
        answer,
        note: format!("keyboard-interactive refused {}", times(refused)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn methods_follow_preferred_authentications() {
        assert_eq!(method_order(None), DEFAULT_ORDER.to_vec());
        assert_eq!(
            method_order(Some(&names(&[
                "gssapi-with-mic",
                "password",
                "hostbased",
                "publickey",
                "password"
            ]))),
            vec![AuthMethod::Password, AuthMethod::PublicKey]
        );
        assert!(method_order(Some(&names(&["hostbased"]))).is_empty());
        // Method names are case-sensitive, as on the wire.
        assert!(method_order(Some(&names(&["Password"]))).is_empty());
    }

    #[test]
    fn nobody_is_asked_under_batch_mode_and_a_fan_out_asks_once() {
        assert_eq!(asking(false, false), Asking::Person);
        assert_eq!(asking(true, false), Asking::BatchMode);
        assert_eq!(asking(true, true), Asking::BatchMode);
        assert_eq!(asking(false, true), Asking::FanOut);
        assert!(Asking::Person.why_not().is_none());
        assert!(Asking::FanOut.why_not().is_none());
        assert!(Asking::BatchMode.why_not().unwrap().contains("BatchMode"));
    }

    #[test]
    fn a_servers_questions_cannot_steer_the_terminal() {
        let prompts = [
            russh::client::Prompt {
                prompt: "Code\u{1b}[2K\r: ".into(),
                echo: true,
            },
            russh::client::Prompt {
                prompt: "Password: ".into(),
                echo: false,
            },
        ];
        let (text, asked) =
            shown_request("", "Line one\nline \u{1b}]52;c;aGk=\u{7}two\n", &prompts);
        assert_eq!(text, ["Line one\nline \\u{1b}]52;c;aGk=\\u{7}two"]);
        assert_eq!(
            asked,
            [
                ("Code\\u{1b}[2K\\r: ".to_string(), true),
                ("Password: ".to_string(), false)
            ]
        );
        let (text, _) = shown_request("PAM\n", "", &[]);
        assert_eq!(text, ["PAM"]);
    }

    #[test]
    fn askpass_is_chosen_as_ssh_chooses_it() {
        // force and prefer: whenever a program is set.
        assert!(use_askpass(true, "force", true, false));
        assert!(use_askpass(true, "prefer", true, false));
        assert!(!use_askpass(false, "force", false, true));
        // never: never.
        assert!(!use_askpass(true, "never", false, true));
        // Unset: only without a terminal and with a display.
        assert!(use_askpass(true, "", false, true));
        assert!(!use_askpass(true, "", true, true));
        assert!(!use_askpass(true, "", false, false));
        assert!(!use_askpass(false, "", false, true));
    }
}
