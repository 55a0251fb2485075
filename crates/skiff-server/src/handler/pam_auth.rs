//! The password and keyboard-interactive methods, both through PAM
//! (`UsePAM yes`): the client's password or answers go to the login's PAM
//! transaction ([`crate::pam`]), and a success is a step like any other
//! (`AuthenticationMethods`, PAM's account check, `/etc/nologin`; see
//! `auth::logged_in`). An account that may not log in still goes through
//! PAM, as a user that does not exist, so that its refusal takes as long
//! as a wrong password's; whatever PAM says, it is refused.

use bytes::Bytes;
use russh::server::Auth;
use skiff_proto::authorized_keys::KeyOptions;

use super::ConnectionHandler;
use crate::account::Account;
use crate::auth_log::How;
use crate::auth_methods::Method;
use crate::pam::{PamLogin, Turn, NO_SUCH_USER};
use crate::pam_policy;

impl ConnectionHandler {
    /// The login's PAM transaction for `user` (a new one when the client
    /// changed the user name).
    pub(super) fn pam_for(&mut self, user: &str) -> &mut PamLogin {
        let service = &self.settings().pam.service;
        if self.pam.as_ref().is_none_or(|p| p.user() != user) {
            let rhost = (!self.peer_unknown).then(|| self.peer.ip());
            self.pam = Some(PamLogin::start(service, user, rhost));
        }
        self.pam.as_mut().expect("started above")
    }

    /// Whether `method` may be tried by `user` now; logs why not.
    fn method_open(&self, user: &str, method: Method) -> bool {
        if !self.settings().pam.offers(method) {
            return false;
        }
        match self.step_refusal(user, method, None) {
            Some(why) => {
                tracing::info!(peer = %self.peer, user, "{method} refused: {why}");
                false
            }
            None => true,
        }
    }

    /// The account `user` names, if it may log in by password or
    /// keyboard-interactive (root only under `PermitRootLogin yes`, as in
    /// sshd), and the name PAM authenticates: the account's, or one that
    /// does not exist. Worked out once per request.
    fn pam_account(&self, user: &str) -> (Option<Account>, String) {
        let account = self.load_candidate(user).map(|(account, _)| account);
        let account = match account {
            Some(a)
                if a.uid == 0 && !self.settings().access.root_login.admits_root_by_password() =>
            {
                tracing::info!(peer = %self.peer, user,
                    "refusing root's password: PermitRootLogin is not yes");
                None
            }
            other => other.cloned(),
        };
        let pam_user = account
            .as_ref()
            .map_or_else(|| NO_SUCH_USER.to_string(), |a| a.name.clone());
        (account, pam_user)
    }

    /// `SSH_MSG_USERAUTH_REQUEST` with the password method.
    pub(super) async fn password_login(
        &mut self,
        user: &str,
        password: &str,
    ) -> Result<Auth, russh::Error> {
        self.prepare_candidate(user).await;
        if !self.method_open(user, Method::Password) {
            return Ok(self.refused());
        }
        let password = match pam_policy::answer_text(password.as_bytes()) {
            Ok(p) => p,
            Err(why) => {
                tracing::info!(peer = %self.peer, user, "password refused: {why}");
                let refused = self.refused();
                self.judged(user, How::Password, &refused);
                return Ok(refused);
            }
        };
        let auth = if password.is_empty() && !self.settings().pam.permit_empty_passwords {
            tracing::debug!(peer = %self.peer, user, "empty password refused (PermitEmptyPasswords no)");
            self.password_failed();
            self.refused()
        } else {
            let (account, pam_user) = self.pam_account(user);
            let verdict = self.pam_for(&pam_user).password(password).await;
            self.step_by_pam(user, account, Method::Password, verdict)
                .await
        };
        self.judged(user, How::Password, &auth);
        Ok(auth)
    }

    /// `SSH_MSG_USERAUTH_REQUEST` with keyboard-interactive (`answers` is
    /// `None`) and each `SSH_MSG_USERAUTH_INFO_RESPONSE` after it.
    pub(super) async fn interactive_login(
        &mut self,
        user: &str,
        answers: Option<Vec<Bytes>>,
    ) -> Result<Auth, russh::Error> {
        self.prepare_candidate(user).await;
        let asked = self.kbd_round.take();
        if !self.method_open(user, Method::KeyboardInteractive) {
            return Ok(self.refused());
        }
        let (account, pam_user) = self.pam_account(user);
        let turn = match (answers, asked) {
            (None, _) => self.pam_for(&pam_user).interactive().await,
            (Some(answers), Some(asked)) => match pam_policy::answers(asked, answers) {
                Ok(answers) => self.pam_for(&pam_user).answer(answers).await,
                Err(why) => {
                    tracing::info!(peer = %self.peer, user, "keyboard-interactive answers refused: {why}");
                    Turn::Done(Err(crate::pam::PamError::Unavailable(why.to_string())))
                }
            },
            (Some(_), None) => Turn::Done(Err(crate::pam::PamError::Unavailable(
                "answers to no question".into(),
            ))),
        };
        let turn = match turn {
            Turn::Done(Ok(())) if account.is_some() => {
                self.expired_password_turn(user, &pam_user).await
            }
            other => other,
        };
        let verdict = match turn {
            Turn::Ask(round) => {
                self.kbd_round = Some(round.prompts.len());
                let prompts: Vec<_> = round
                    .prompts
                    .into_iter()
                    .map(|(prompt, echo)| (prompt.into(), echo))
                    .collect();
                return Ok(Auth::Partial {
                    name: "".into(),
                    instructions: round.instruction.into(),
                    prompts: prompts.into(),
                });
            }
            Turn::Done(verdict) => verdict,
        };
        let auth = self
            .step_by_pam(user, account, Method::KeyboardInteractive, verdict)
            .await;
        self.judged(user, How::KeyboardInteractive, &auth);
        Ok(auth)
    }

    /// After PAM accepted an account's answers: when its password has
    /// expired, the questions of changing it (as sshd asks them in
    /// keyboard-interactive), once per login; else the success as it is.
    async fn expired_password_turn(&mut self, user: &str, pam_user: &str) -> Turn {
        if self.password_changed {
            return Turn::Done(Ok(()));
        }
        let pam = self.pam_for(pam_user);
        match pam.account().await {
            Err(e) if e.password_expired() => {
                tracing::info!(peer = %self.peer, user, "the password has expired: asking for a new one");
                self.password_changed = true;
                self.pam_for(pam_user).change_expired_password().await
            }
            // Anything else is judged by the account check every login
            // gets (`logged_in`).
            _ => Turn::Done(Ok(())),
        }
    }

    /// What PAM's `verdict` on `user` (`account`, when it may log in this
    /// way) by `method` makes of the login.
    async fn step_by_pam(
        &mut self,
        user: &str,
        account: Option<Account>,
        method: Method,
        verdict: Result<(), crate::pam::PamError>,
    ) -> Auth {
        match (account, verdict) {
            (Some(account), Ok(())) => {
                let line = format!("{}\n", method.name());
                self.logged_in(account, KeyOptions::default(), line, method, None)
                    .await
            }
            (account, Err(e)) => {
                tracing::debug!(peer = %self.peer, user, "PAM refused {method}: {e}");
                self.password_failed();
                // A wrong password is in btmp, as sshd records it (an
                // unknown name is recorded when it is first seen).
                if account.is_some() {
                    let addr = self.log.peer().map(|p| p.ip());
                    crate::login_writer::record_failed(user, addr);
                }
                self.refused()
            }
            // PAM let a name in that skiffd refuses (it does not exist, or
            // AllowUsers and the like keep it out): refused all the same.
            (None, Ok(())) => {
                self.password_failed();
                self.refused()
            }
        }
    }
}
