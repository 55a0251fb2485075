//! What PAM may do for a login, and how its conversation maps onto SSH:
//! the settings (`UsePAM`, `PAMServiceName`, `PasswordAuthentication`,
//! `KbdInteractiveAuthentication`, `PermitEmptyPasswords`), which methods
//! they offer, the password method's answers to PAM's questions, and the
//! rounds of keyboard-interactive questions PAM's messages become. Also
//! the checks on what a client answers before PAM sees it.
//!
//! skiffd checks passwords only through PAM: without `UsePAM yes` neither
//! password nor keyboard-interactive authentication is offered, whatever
//! the other settings say. Pure: no I/O (the PAM calls are in
//! [`crate::pam`]).

use zeroize::Zeroizing;

use crate::auth_methods::Method;

/// The PAM settings of a login.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PamSettings {
    /// `UsePAM` (default no, as sshd).
    pub use_pam: bool,
    /// `PAMServiceName`: the file in /etc/pam.d (default `skiffd`).
    pub service: String,
    /// `PasswordAuthentication` (default yes, as sshd; only with PAM).
    pub password: bool,
    /// `KbdInteractiveAuthentication` (default yes, as sshd; only with PAM).
    pub keyboard_interactive: bool,
    /// `PermitEmptyPasswords` (default no).
    pub permit_empty_passwords: bool,
}

impl Default for PamSettings {
    fn default() -> Self {
        PamSettings {
            use_pam: false,
            service: DEFAULT_SERVICE.to_string(),
            password: true,
            keyboard_interactive: true,
            permit_empty_passwords: false,
        }
    }
}

/// The PAM service skiffd uses unless `PAMServiceName` names another.
pub const DEFAULT_SERVICE: &str = "skiffd";

/// The longest answer (a password, say) passed on to PAM.
pub const MAX_ANSWER: usize = 4096;

impl PamSettings {
    /// Whether a login may use `method` at all under these settings.
    pub fn offers(&self, method: Method) -> bool {
        match method {
            Method::PublicKey => true,
            Method::Password => self.use_pam && self.password,
            Method::KeyboardInteractive => self.use_pam && self.keyboard_interactive,
            Method::HostBased | Method::GssapiWithMic | Method::None => false,
        }
    }

    /// The methods offered, in the order sshd lists them.
    pub fn methods(&self) -> Vec<Method> {
        [
            Method::PublicKey,
            Method::Password,
            Method::KeyboardInteractive,
        ]
        .into_iter()
        .filter(|m| self.offers(*m))
        .collect()
    }
}

/// Checks a `PAMServiceName` value: PAM reads `/etc/pam.d/NAME`, so the
/// name is a plain file name.
pub fn service_name(name: &str) -> Result<String, String> {
    let plain = !name.is_empty()
        && !name.starts_with('.')
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
    if plain {
        Ok(name.to_string())
    } else {
        Err(format!(
            "PAMServiceName {name:?}: a service is a file name in /etc/pam.d \
             (letters, digits, '-', '_' and '.')"
        ))
    }
}

/// A message PAM's conversation passes to skiffd.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Message {
    /// A question whose answer may be shown as typed (a user name).
    EchoOn(String),
    /// A question whose answer is secret (a password).
    EchoOff(String),
    Info(String),
    Error(String),
}

/// Why skiffd does not answer a question PAM asks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Unanswered {
    #[error("the password method answers only a hidden question (the password)")]
    NotThePassword,
    #[error("the client gave no answer")]
    NoAnswer,
}

/// The password method's side of PAM's conversation: the password the
/// client sent answers every hidden question; a question to be shown as
/// typed has no answer (the method has none to give); messages are kept
/// for the log.
pub struct PasswordConversation {
    password: Zeroizing<String>,
    pub messages: Vec<String>,
}

impl PasswordConversation {
    pub fn new(password: Zeroizing<String>) -> Self {
        PasswordConversation {
            password,
            messages: Vec::new(),
        }
    }

    pub fn answer(&mut self, message: Message) -> Result<Option<Zeroizing<String>>, Unanswered> {
        match message {
            Message::EchoOff(_) => Ok(Some(self.password.clone())),
            Message::EchoOn(_) => Err(Unanswered::NotThePassword),
            Message::Info(text) | Message::Error(text) => {
                self.messages.push(text);
                Ok(None)
            }
        }
    }
}

/// One `SSH_MSG_USERAUTH_INFO_REQUEST`: PAM's messages since the last
/// question as its instruction, and the question.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Round {
    pub instruction: String,
    pub prompts: Vec<(String, bool)>,
}

/// Turns PAM's messages into keyboard-interactive rounds: information and
/// errors wait (as the next round's instruction) until PAM asks something.
#[derive(Debug, Default)]
pub struct Rounds {
    pending: String,
}

impl Rounds {
    /// The round `message` starts, if it is a question.
    pub fn message(&mut self, message: Message) -> Option<Round> {
        let (prompt, echo) = match message {
            Message::Info(text) | Message::Error(text) => {
                self.pending.push_str(&text);
                if !text.ends_with('\n') {
                    self.pending.push('\n');
                }
                return None;
            }
            Message::EchoOn(p) => (p, true),
            Message::EchoOff(p) => (p, false),
        };
        Some(Round {
            instruction: std::mem::take(&mut self.pending),
            prompts: vec![(prompt, echo)],
        })
    }

    /// Messages PAM sent after its last question.
    pub fn leftover(&mut self) -> String {
        std::mem::take(&mut self.pending)
    }
}

/// Why a client's answers are refused before PAM sees them.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BadAnswer {
    #[error("{got} answers to {asked} questions")]
    Count { asked: usize, got: usize },
    #[error("an answer of {0} bytes (at most {MAX_ANSWER})")]
    TooLong(usize),
    #[error("an answer holds a NUL byte")]
    Nul,
    #[error("an answer is not UTF-8")]
    NotUtf8,
}

/// Checks the answers to a round of `asked` questions: as many as asked,
/// each short, UTF-8 and without NUL (PAM takes C strings).
pub fn answers(
    asked: usize,
    given: impl IntoIterator<Item = impl AsRef<[u8]>>,
) -> Result<Vec<Zeroizing<String>>, BadAnswer> {
    let mut out = Vec::new();
    for answer in given {
        out.push(answer_text(answer.as_ref())?);
    }
    if out.len() != asked {
        return Err(BadAnswer::Count {
            asked,
            got: out.len(),
        });
    }
    Ok(out)
}

/// One answer (or a password) as PAM may take it.
pub fn answer_text(bytes: &[u8]) -> Result<Zeroizing<String>, BadAnswer> {
    if bytes.len() > MAX_ANSWER {
        return Err(BadAnswer::TooLong(bytes.len()));
    }
    if bytes.contains(&0) {
        return Err(BadAnswer::Nul);
    }
    let text = std::str::from_utf8(bytes).map_err(|_| BadAnswer::NotUtf8)?;
    Ok(Zeroizing::new(text.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_need_pam() {
        let mut s = PamSettings::default();
        assert_eq!(s.methods(), [Method::PublicKey]);
        s.use_pam = true;
        assert_eq!(
            s.methods(),
            [
                Method::PublicKey,
                Method::Password,
                Method::KeyboardInteractive
            ]
        );
        s.password = false;
        assert_eq!(
            s.methods(),
            [Method::PublicKey, Method::KeyboardInteractive]
        );
        assert!(!s.offers(Method::HostBased));
    }

    #[test]
    fn service_names_are_file_names() {
        assert_eq!(service_name("skiffd").unwrap(), "skiffd");
        assert_eq!(service_name("sshd-2.test").unwrap(), "sshd-2.test");
        for bad in ["", "../shadow", "a/b", ".hidden", "a b", "é"] {
            assert!(service_name(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn the_password_answers_hidden_questions_only() {
        let mut conv = PasswordConversation::new(Zeroizing::new("s3cret".into()));
        assert_eq!(
            conv.answer(Message::EchoOff("Password: ".into()))
                .unwrap()
                .as_deref()
                .map(|s| s.as_str()),
            Some("s3cret")
        );
        assert_eq!(
            conv.answer(Message::EchoOn("login: ".into())),
            Err(Unanswered::NotThePassword)
        );
        assert_eq!(conv.answer(Message::Info("hello".into())), Ok(None));
        assert_eq!(conv.messages, ["hello"]);
    }

    #[test]
    fn messages_become_the_next_rounds_instruction() {
        let mut rounds = Rounds::default();
        assert_eq!(rounds.message(Message::Info("Welcome".into())), None);
        assert_eq!(rounds.message(Message::Error("Careful\n".into())), None);
        let round = rounds
            .message(Message::EchoOff("Password: ".into()))
            .unwrap();
        assert_eq!(round.instruction, "Welcome\nCareful\n");
        assert_eq!(round.prompts, [("Password: ".to_string(), false)]);
        let round = rounds.message(Message::EchoOn("Token: ".into())).unwrap();
        assert_eq!(round.instruction, "");
        assert_eq!(round.prompts, [("Token: ".to_string(), true)]);
        assert_eq!(rounds.message(Message::Info("bye".into())), None);
        assert_eq!(rounds.leftover(), "bye\n");
    }

    #[test]
    fn hostile_answers_are_refused() {
        assert_eq!(answers(1, [b"pw".as_slice()]).unwrap()[0].as_str(), "pw");
        assert_eq!(
            answers(2, [b"pw".as_slice()]),
            Err(BadAnswer::Count { asked: 2, got: 1 })
        );
        assert_eq!(answers(1, [b"p\0w".as_slice()]), Err(BadAnswer::Nul));
        assert_eq!(
            answers(1, [vec![b'a'; MAX_ANSWER + 1]]),
            Err(BadAnswer::TooLong(MAX_ANSWER + 1))
        );
        assert_eq!(answers(1, [[0xffu8, 0xfe]]), Err(BadAnswer::NotUtf8));
        assert!(answers(0, Vec::<Vec<u8>>::new()).unwrap().is_empty());
    }
}
