//! PAM for one connection's login: `pam_authenticate` for the password
//! and keyboard-interactive methods and `pam_acct_mgmt` after every
//! successful login, whatever the method, as sshd calls them.
//!
//! PAM modules block (pam_unix's delay after a failure, a module waiting
//! on a network service or on a hung helper), so each connection that
//! needs PAM gets a thread of its own holding the PAM transaction; the
//! async side ([`PamLogin`]) sends it requests and awaits its events. A
//! module that hangs holds that thread only: the connection's
//! `LoginGraceTime` ends the connection, which closes the channels, and
//! the thread ends as soon as PAM returns. The conversation rules (what
//! the password answers, how messages become keyboard-interactive rounds)
//! are [`crate::pam_policy`]'s.
//!
//! PAM's session calls (`pam_open_session`, `pam_setcred`) change the
//! process that makes them (limits, login uid, control group), so they do
//! not belong in skiffd's shared process; they are not made here.

use std::ffi::{CStr, CString};
use std::net::IpAddr;
use std::rc::Rc;
use std::sync::mpsc;

use pam_client::{ConversationHandler, ErrorCode, Flag};
use tokio::sync::mpsc as async_mpsc;
use zeroize::Zeroizing;

use crate::pam_policy::{Message, PasswordConversation, Round, Rounds};

/// The user name PAM is given for a login whose account may not log in,
/// so that it takes as long to fail as a wrong password does (and can
/// never succeed: the result is ignored).
pub const NO_SUCH_USER: &str = "NOUSER";

/// Why PAM refused, or could not be asked.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PamError {
    /// A PAM call failed with this code.
    #[error("{message}")]
    Refused { code: ErrorCode, message: String },
    /// The PAM thread could not start, or is gone.
    #[error("PAM is unavailable: {0}")]
    Unavailable(String),
}

impl PamError {
    fn from_pam(e: pam_client::Error) -> PamError {
        PamError::Refused {
            code: e.code(),
            message: e
                .message()
                .map_or_else(|| format!("{:?}", e.code()), str::to_string),
        }
    }

    /// The account must change an expired password before it may log in.
    pub fn password_expired(&self) -> bool {
        matches!(
            self,
            PamError::Refused {
                code: ErrorCode::NEW_AUTHTOK_REQD,
                ..
            }
        )
    }
}

/// Where PAM looks for a service's stack.
const PAM_DIR: &str = "/etc/pam.d";

/// A warning for `UsePAM yes` with a service that has no file: PAM then
/// uses the `other` service's stack, which is rarely what was meant.
pub fn missing_service_note(settings: &crate::pam_policy::PamSettings) -> Option<String> {
    let path = std::path::Path::new(PAM_DIR).join(&settings.service);
    (settings.use_pam && !path.exists()).then(|| {
        format!(
            "UsePAM yes: {} does not exist, so PAM applies {PAM_DIR}/other to logins \
             (PAMServiceName names another service)",
            path.display()
        )
    })
}

/// The line logged when PAM's account check refuses `user` (sshd's words
/// for it, then PAM's reason).
pub fn account_refusal(user: &str, peer: Option<std::net::SocketAddr>, e: &PamError) -> String {
    let from = peer.map_or_else(|| "UNKNOWN".to_string(), |p| p.ip().to_string());
    let what = if e.password_expired() {
        "the password has expired and must be changed first (skiffd cannot change it)".to_string()
    } else {
        e.to_string()
    };
    format!(
        "Access denied for user {} by PAM account configuration from {from}: {what}",
        crate::auth_log::printable(user)
    )
}

/// What the async side asks of the PAM thread.
enum Request {
    Password(Zeroizing<String>),
    Interactive,
    /// The answers to the round the thread last sent.
    Answers(Vec<Zeroizing<String>>),
    /// The client went on to something else mid-conversation.
    Abandon,
    Account,
    /// `pam_chauthtok` for an expired password, relaying PAM's questions.
    ChangeExpired,
}

/// What the PAM thread tells the async side.
enum Event {
    Ask(Round),
    Done(Result<(), PamError>),
}

/// What a keyboard-interactive step leads to: another round of questions,
/// or PAM's verdict.
#[derive(Debug)]
pub enum Turn {
    Ask(Round),
    Done(Result<(), PamError>),
}

/// One login's PAM transaction, held by its own thread.
pub struct PamLogin {
    user: String,
    requests: mpsc::Sender<Request>,
    events: async_mpsc::UnboundedReceiver<Event>,
    /// A keyboard-interactive conversation is waiting for answers.
    conversing: bool,
}

impl PamLogin {
    /// Starts PAM's transaction for `user` under `service`, with the
    /// client's address as `PAM_RHOST` and `ssh` as `PAM_TTY` (as sshd,
    /// for pam_access and pam_securetty).
    pub fn start(service: &str, user: &str, rhost: Option<IpAddr>) -> PamLogin {
        let (requests, inbox) = mpsc::channel();
        let (outbox, events) = async_mpsc::unbounded_channel();
        let service = service.to_string();
        let pam_user = user.to_string();
        let spawned = std::thread::Builder::new().name("pam".into()).spawn({
            let outbox = outbox.clone();
            move || run(&service, &pam_user, rhost, inbox, outbox)
        });
        if let Err(e) = spawned {
            let _ = outbox.send(Event::Done(Err(PamError::Unavailable(e.to_string()))));
        }
        PamLogin {
            user: user.to_string(),
            requests,
            events,
            conversing: false,
        }
    }

    /// The user name PAM was started with.
    pub fn user(&self) -> &str {
        &self.user
    }

    /// `pam_authenticate` answering PAM's hidden questions with `password`.
    pub async fn password(&mut self, password: Zeroizing<String>) -> Result<(), PamError> {
        self.verdict(Request::Password(password)).await
    }

    /// Starts `pam_authenticate` relaying PAM's questions to the client.
    pub async fn interactive(&mut self) -> Turn {
        self.settle().await;
        self.ask(Request::Interactive).await
    }

    /// The client's answers to the last round.
    pub async fn answer(&mut self, answers: Vec<Zeroizing<String>>) -> Turn {
        if !self.conversing {
            return Turn::Done(Err(PamError::Unavailable(
                "answers with no question outstanding".into(),
            )));
        }
        self.ask(Request::Answers(answers)).await
    }

    /// `pam_chauthtok(PAM_CHANGE_EXPIRED_AUTHTOK)`, relaying PAM's
    /// questions ("Current password:", "New password:") to the client.
    pub async fn change_expired_password(&mut self) -> Turn {
        self.settle().await;
        self.ask(Request::ChangeExpired).await
    }

    /// `pam_acct_mgmt`: may the authenticated account log in now?
    pub async fn account(&mut self) -> Result<(), PamError> {
        self.verdict(Request::Account).await
    }

    /// PAM's verdict on a request whose conversation asks the client
    /// nothing (the thread answers or refuses every question itself).
    async fn verdict(&mut self, request: Request) -> Result<(), PamError> {
        self.settle().await;
        match self.ask(request).await {
            Turn::Done(result) => result,
            Turn::Ask(_) => Err(PamError::Unavailable(
                "PAM asked a question no one can answer".into(),
            )),
        }
    }

    /// Ends a conversation the client left half-way.
    async fn settle(&mut self) {
        if self.conversing {
            // The thread stops relaying questions once abandoned, so its
            // answer is PAM's verdict.
            let _ = self.ask(Request::Abandon).await;
        }
    }

    async fn ask(&mut self, request: Request) -> Turn {
        if self.requests.send(request).is_err() {
            self.conversing = false;
            return Turn::Done(Err(PamError::Unavailable("the PAM thread ended".into())));
        }
        let turn = match self.events.recv().await {
            Some(Event::Ask(round)) => Turn::Ask(round),
            Some(Event::Done(result)) => Turn::Done(result),
            None => Turn::Done(Err(PamError::Unavailable("the PAM thread ended".into()))),
        };
        self.conversing = matches!(turn, Turn::Ask(_));
        turn
    }
}

/// How the thread's conversation answers, for the call in progress.
enum Mode {
    /// No call expects a question: every question fails.
    Idle,
    Password(PasswordConversation),
    Interactive(Rounds),
}

/// The conversation PAM calls back, on the PAM thread. Every request the
/// thread reads, here or in [`run`], is answered with exactly one event.
struct Bridge {
    mode: Mode,
    inbox: Rc<mpsc::Receiver<Request>>,
    outbox: async_mpsc::UnboundedSender<Event>,
}

impl Bridge {
    fn message(&mut self, message: Message) -> Result<Option<CString>, ErrorCode> {
        let answer = match &mut self.mode {
            Mode::Idle => match message {
                Message::Info(text) | Message::Error(text) => {
                    tracing::debug!("PAM says: {}", crate::auth_log::printable(&text));
                    return Ok(None);
                }
                _ => return Err(ErrorCode::CONV_ERR),
            },
            Mode::Password(conv) => conv.answer(message).map_err(|why| {
                tracing::debug!("PAM question not answered: {why}");
                ErrorCode::CONV_ERR
            })?,
            Mode::Interactive(rounds) => match rounds.message(message) {
                None => return Ok(None),
                Some(round) => {
                    if self.outbox.send(Event::Ask(round)).is_err() {
                        return Err(ErrorCode::CONV_ERR);
                    }
                    match self.inbox.recv() {
                        Ok(Request::Answers(mut answers)) if answers.len() == 1 => answers.pop(),
                        // Abandoned (or answered wrongly): PAM's further
                        // questions in this call fail without reaching
                        // the client.
                        _ => {
                            self.mode = Mode::Idle;
                            return Err(ErrorCode::CONV_ERR);
                        }
                    }
                }
            },
        };
        match answer {
            None => Ok(None),
            Some(text) => CString::new(text.as_bytes())
                .map(Some)
                .map_err(|_| ErrorCode::CONV_ERR),
        }
    }

    fn answered(&mut self, message: Message) -> Result<CString, ErrorCode> {
        self.message(message)?.ok_or(ErrorCode::CONV_ERR)
    }
}

fn text(s: &CStr) -> String {
    s.to_string_lossy().into_owned()
}

impl ConversationHandler for Bridge {
    fn prompt_echo_on(&mut self, prompt: &CStr) -> Result<CString, ErrorCode> {
        self.answered(Message::EchoOn(text(prompt)))
    }

    fn prompt_echo_off(&mut self, prompt: &CStr) -> Result<CString, ErrorCode> {
        self.answered(Message::EchoOff(text(prompt)))
    }

    fn text_info(&mut self, msg: &CStr) {
        let _ = self.message(Message::Info(text(msg)));
    }

    fn error_msg(&mut self, msg: &CStr) {
        let _ = self.message(Message::Error(text(msg)));
    }
}

/// The PAM thread: one transaction, serving requests until the
/// connection drops its [`PamLogin`].
fn run(
    service: &str,
    user: &str,
    rhost: Option<IpAddr>,
    inbox: mpsc::Receiver<Request>,
    outbox: async_mpsc::UnboundedSender<Event>,
) {
    let inbox = Rc::new(inbox);
    let bridge = Bridge {
        mode: Mode::Idle,
        inbox: inbox.clone(),
        outbox: outbox.clone(),
    };
    let started = pam_client::Context::new(service, Some(user), bridge).and_then(|mut ctx| {
        if let Some(ip) = rhost {
            ctx.set_rhost(Some(&ip.to_string()))?;
        }
        ctx.set_tty(Some("ssh"))?;
        Ok(ctx)
    });
    let mut ctx = match started {
        Ok(ctx) => ctx,
        Err(e) => {
            let why =
                PamError::Unavailable(format!("PAM service {service}: {}", PamError::from_pam(e)));
            // Every request gets the same answer until the login ends.
            while inbox.recv().is_ok() {
                let _ = outbox.send(Event::Done(Err(why.clone())));
            }
            return;
        }
    };
    loop {
        let request = match inbox.recv() {
            Ok(r) => r,
            Err(_) => break,
        };
        let result = match request {
            Request::Password(password) => {
                ctx.conversation_mut().mode = Mode::Password(PasswordConversation::new(password));
                let r = ctx.authenticate(Flag::NONE);
                if let Mode::Password(conv) = &ctx.conversation().mode {
                    for m in &conv.messages {
                        tracing::debug!("PAM says: {}", crate::auth_log::printable(m));
                    }
                }
                r
            }
            Request::Interactive => {
                ctx.conversation_mut().mode = Mode::Interactive(Rounds::default());
                ctx.authenticate(Flag::NONE)
            }
            Request::Account => ctx.acct_mgmt(Flag::NONE),
            Request::ChangeExpired => {
                ctx.conversation_mut().mode = Mode::Interactive(Rounds::default());
                ctx.chauthtok(Flag::CHANGE_EXPIRED_AUTHTOK)
            }
            // Left over from a conversation that has ended already.
            Request::Answers(_) | Request::Abandon => {
                let _ = outbox.send(Event::Done(Err(PamError::Unavailable(
                    "no conversation in progress".into(),
                ))));
                continue;
            }
        };
        ctx.conversation_mut().mode = Mode::Idle;
        if outbox
            .send(Event::Done(result.map_err(PamError::from_pam)))
            .is_err()
        {
            break;
        }
    }
}
