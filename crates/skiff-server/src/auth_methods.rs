//! `AuthenticationMethods`: the lists of methods a login must complete,
//! and, for one connection, which steps are done and what to answer next.
//! As in sshd: the login succeeds once every method of any one list has
//! succeeded, in the list's order; at each stage only the methods that
//! come next in some list are offered; a method named twice (e.g.
//! `publickey,publickey`) needs two different credentials (the handler
//! keeps the keys already used, see `handler::auth`).
//!
//! skiffd offers public keys, and passwords and keyboard-interactive
//! through PAM; a list naming another method is refused when the
//! configuration is read. Whether PAM's methods are on for a login is the
//! handler's filter over [`Progress::next_methods`]
//! ([`crate::pam_policy::PamSettings::offers`]). Pure: no I/O.

use std::fmt;

/// An authentication method sshd_config may name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    PublicKey,
    Password,
    KeyboardInteractive,
    HostBased,
    GssapiWithMic,
    None,
}

impl Method {
    /// The method a list entry names (`keyboard-interactive:DEVICE` is
    /// keyboard-interactive).
    pub fn parse(name: &str) -> Option<Method> {
        let base = name.split_once(':').map_or(name, |(m, _)| m);
        Some(match base {
            "publickey" if base.len() == name.len() => Method::PublicKey,
            "password" if base.len() == name.len() => Method::Password,
            "keyboard-interactive" => Method::KeyboardInteractive,
            "hostbased" if base.len() == name.len() => Method::HostBased,
            "gssapi-with-mic" if base.len() == name.len() => Method::GssapiWithMic,
            "none" if base.len() == name.len() => Method::None,
            _ => return None,
        })
    }

    /// The method's protocol name.
    pub fn name(self) -> &'static str {
        match self {
            Method::PublicKey => "publickey",
            Method::Password => "password",
            Method::KeyboardInteractive => "keyboard-interactive",
            Method::HostBased => "hostbased",
            Method::GssapiWithMic => "gssapi-with-mic",
            Method::None => "none",
        }
    }

    /// Whether skiffd can authenticate with this method (passwords and
    /// keyboard-interactive only with `UsePAM yes`).
    pub fn offered(self) -> bool {
        matches!(
            self,
            Method::PublicKey | Method::Password | Method::KeyboardInteractive
        )
    }

    /// Every method skiffd can authenticate with.
    pub const OFFERED: [Method; 3] = [
        Method::PublicKey,
        Method::Password,
        Method::KeyboardInteractive,
    ];
}

impl fmt::Display for Method {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Why an `AuthenticationMethods` value is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MethodsError {
    #[error("AuthenticationMethods needs `any` or one or more lists of methods")]
    Empty,
    #[error("AuthenticationMethods: `any` cannot be combined with lists")]
    AnyWithLists,
    #[error("AuthenticationMethods: empty method name in {0:?}")]
    EmptyName(String),
    #[error("AuthenticationMethods: unknown method {0:?}")]
    Unknown(String),
    #[error(
        "AuthenticationMethods {value}: skiffd offers publickey, password and \
         keyboard-interactive, and cannot require {method}"
    )]
    NotOffered { value: String, method: Method },
}

/// The `AuthenticationMethods` setting.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum AuthMethods {
    /// `any` (the default): one successful method is enough.
    #[default]
    Any,
    /// Every method of one of these lists, in order.
    Lists(Vec<Vec<Method>>),
}

impl AuthMethods {
    /// Parses the words after `AuthenticationMethods`.
    pub fn parse(args: &[&str]) -> Result<AuthMethods, MethodsError> {
        match args {
            [] => return Err(MethodsError::Empty),
            ["any"] => return Ok(AuthMethods::Any),
            _ if args.contains(&"any") => return Err(MethodsError::AnyWithLists),
            _ => {}
        }
        let mut lists = Vec::new();
        for list in args {
            let mut methods = Vec::new();
            for name in list.split(',') {
                if name.is_empty() {
                    return Err(MethodsError::EmptyName(list.to_string()));
                }
                let method =
                    Method::parse(name).ok_or_else(|| MethodsError::Unknown(name.to_string()))?;
                if !method.offered() {
                    return Err(MethodsError::NotOffered {
                        value: args.join(" "),
                        method,
                    });
                }
                methods.push(method);
            }
            lists.push(methods);
        }
        Ok(AuthMethods::Lists(lists))
    }

    /// A connection's progress through these lists, nothing done yet.
    pub fn start(&self) -> Progress {
        Progress {
            remaining: match self {
                AuthMethods::Any => None,
                AuthMethods::Lists(lists) => Some(lists.clone()),
            },
        }
    }
}

/// What to answer once a method has succeeded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// A list is complete: the login succeeds.
    Complete,
    /// Partial success: these methods may come next.
    Partial(Vec<Method>),
    /// The method is next in no list (it should not have been offered).
    NotAllowed,
}

/// One connection's progress: for each list, the methods still to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Progress {
    /// `None`: `AuthenticationMethods any`.
    remaining: Option<Vec<Vec<Method>>>,
}

impl Progress {
    /// The methods that may come next (each once, in list order); with
    /// `any`, every method skiffd can offer.
    pub fn next_methods(&self) -> Vec<Method> {
        let mut next = Vec::new();
        match &self.remaining {
            None => next.extend(Method::OFFERED),
            Some(lists) => {
                for m in lists.iter().filter_map(|l| l.first()) {
                    if !next.contains(m) {
                        next.push(*m);
                    }
                }
            }
        }
        next
    }

    /// Whether `method` may be tried now.
    pub fn allows(&self, method: Method) -> bool {
        self.next_methods().contains(&method)
    }

    /// Records that `method` succeeded: it is done in every list where it
    /// came next; lists where it did not come next stay as they were.
    pub fn record(&mut self, method: Method) -> Step {
        let Some(lists) = &mut self.remaining else {
            return Step::Complete;
        };
        let mut found = false;
        for list in lists.iter_mut() {
            if list.first() == Some(&method) {
                list.remove(0);
                found = true;
                if list.is_empty() {
                    return Step::Complete;
                }
            }
        }
        if found {
            Step::Partial(self.next_methods())
        } else {
            Step::NotAllowed
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use Method::*;

    fn parse(line: &str) -> Result<AuthMethods, MethodsError> {
        AuthMethods::parse(&line.split_whitespace().collect::<Vec<_>>())
    }

    #[test]
    fn parsing() {
        assert_eq!(parse("any"), Ok(AuthMethods::Any));
        assert_eq!(
            parse("publickey,publickey publickey"),
            Ok(AuthMethods::Lists(vec![
                vec![PublicKey, PublicKey],
                vec![PublicKey]
            ]))
        );
        assert_eq!(parse(""), Err(MethodsError::Empty));
        assert_eq!(parse("any publickey"), Err(MethodsError::AnyWithLists));
        assert!(matches!(
            parse("publickey,,publickey"),
            Err(MethodsError::EmptyName(_))
        ));
        assert_eq!(
            parse("publickey,magic"),
            Err(MethodsError::Unknown("magic".into()))
        );
        for (line, method) in [
            ("hostbased", HostBased),
            ("publickey,gssapi-with-mic", GssapiWithMic),
        ] {
            let e = parse(line).unwrap_err();
            assert!(
                matches!(&e, MethodsError::NotOffered { method: m, .. } if *m == method),
                "{line}: {e:?}"
            );
            assert!(e.to_string().contains("cannot require"));
        }
        assert_eq!(
            parse("publickey,password publickey,keyboard-interactive:pam"),
            Ok(AuthMethods::Lists(vec![
                vec![PublicKey, Password],
                vec![PublicKey, KeyboardInteractive]
            ]))
        );
        assert_eq!(
            Method::parse("keyboard-interactive:bsdauth"),
            Some(KeyboardInteractive)
        );
        assert!(Method::parse("publickey:x").is_none());
    }

    #[test]
    fn any_completes_at_once() {
        let mut p = AuthMethods::Any.start();
        assert_eq!(p.next_methods(), Method::OFFERED);
        assert_eq!(p.record(PublicKey), Step::Complete);
    }

    #[test]
    fn two_keys_need_two_steps() {
        let policy = parse("publickey,publickey").unwrap();
        let mut p = policy.start();
        assert!(p.allows(PublicKey));
        assert_eq!(p.record(PublicKey), Step::Partial(vec![PublicKey]));
        assert_eq!(p.record(PublicKey), Step::Complete);
    }

    #[test]
    fn any_one_list_is_enough() {
        // Either two keys, or one: the first key completes the second list.
        let mut p = parse("publickey,publickey publickey").unwrap().start();
        assert_eq!(p.record(PublicKey), Step::Complete);
    }

    #[test]
    fn lists_advance_only_where_the_method_comes_next() {
        let mut p = AuthMethods::Lists(vec![
            vec![PublicKey, Password],
            vec![Password, PublicKey],
            vec![PublicKey, KeyboardInteractive],
        ])
        .start();
        assert_eq!(p.next_methods(), vec![PublicKey, Password]);
        assert!(!p.allows(KeyboardInteractive));
        assert_eq!(
            p.record(PublicKey),
            Step::Partial(vec![Password, KeyboardInteractive])
        );
        assert!(!p.allows(PublicKey));
        assert_eq!(p.record(PublicKey), Step::NotAllowed);
        // Password: ends the first list.
        assert_eq!(p.record(Password), Step::Complete);

        let mut p = AuthMethods::Lists(vec![vec![Password, PublicKey, PublicKey]]).start();
        assert_eq!(p.record(PublicKey), Step::NotAllowed);
        assert_eq!(p.record(Password), Step::Partial(vec![PublicKey]));
        assert_eq!(p.record(PublicKey), Step::Partial(vec![PublicKey]));
        assert_eq!(p.record(PublicKey), Step::Complete);
    }
}
