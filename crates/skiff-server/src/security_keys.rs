//! Security keys (FIDO, `sk-ssh-ed25519@openssh.com` and
//! `sk-ecdsa-sha2-nistp256@openssh.com`): which authenticator flags a
//! login's signature must carry, and whether skiffd can check them.
//!
//! A security key signs, besides the request, a flags byte and a counter
//! (OpenSSH's PROTOCOL.u2f). Two flags matter: user presence (0x01, the
//! key was touched) and user verification (0x04, a PIN or biometric).
//! As in sshd, presence is required unless the key's authorized_keys line
//! (or its certificate) says `no-touch-required`, and `PubkeyAuthOptions
//! touch-required` makes that exception void; verification is required by
//! `verify-required` (on the line, as a certificate's critical option, or
//! in `PubkeyAuthOptions`).
//!
//! What skiffd can see: russh 0.65 verifies a security key's signature,
//! flags and counter included (they are part of the signed data), but
//! hands the server's handler only the key, never the signature, so the
//! flags are out of reach. A login whose rules require a flag is refused
//! ([`Refusal::FlagsHidden`]): nothing is accepted unchecked. Once russh
//! passes the signature on, [`check`] takes [`Flags::Seen`] and nothing
//! else here changes.
//!
//! Pure: no I/O. The caller (`handler::auth`) logs and refuses.

use skiff_proto::authorized_keys::KeyOptions;

/// The flag a security key sets when a person touched it.
pub const USER_PRESENCE: u8 = 0x01;
/// The flag a security key sets when it verified the person (PIN,
/// biometric).
pub const USER_VERIFICATION: u8 = 0x04;

/// `PubkeyAuthOptions`: the server's own requirements on security-key
/// signatures, whatever authorized_keys says.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PubkeyAuthOptions {
    /// `touch-required`: presence is required even where a key's line says
    /// `no-touch-required`.
    pub touch_required: bool,
    /// `verify-required`: every security-key signature must show user
    /// verification.
    pub verify_required: bool,
}

/// A `PubkeyAuthOptions` value that is not one of sshd's words.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OptionsError {
    #[error("PubkeyAuthOptions needs a value (none, touch-required, verify-required)")]
    Empty,
    #[error("PubkeyAuthOptions: unsupported option {0:?} (none, touch-required, verify-required)")]
    Unsupported(String),
}

impl PubkeyAuthOptions {
    /// Reads the keyword's arguments as sshd does: any of `none`,
    /// `touch-required` and `verify-required` (case-insensitive), `none`
    /// adding nothing.
    pub fn parse(args: &[&str]) -> Result<Self, OptionsError> {
        if args.is_empty() {
            return Err(OptionsError::Empty);
        }
        let mut options = Self::default();
        for arg in args {
            match arg.to_ascii_lowercase().as_str() {
                "none" => {}
                "touch-required" => options.touch_required = true,
                "verify-required" => options.verify_required = true,
                _ => return Err(OptionsError::Unsupported((*arg).to_string())),
            }
        }
        Ok(options)
    }

    /// The value as `sshd -T` prints it.
    pub fn dump(&self) -> String {
        let mut words = Vec::new();
        if self.touch_required {
            words.push("touch-required");
        }
        if self.verify_required {
            words.push("verify-required");
        }
        if words.is_empty() {
            "none".to_string()
        } else {
            words.join(" ")
        }
    }
}

/// What a security-key signature must show for one login.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Required {
    pub presence: bool,
    pub verification: bool,
}

impl Required {
    /// Whether any flag must be checked.
    pub fn any(&self) -> bool {
        self.presence || self.verification
    }

    /// The flags, by name, for messages.
    fn names(&self) -> String {
        match (self.presence, self.verification) {
            (true, true) => "user presence (touch) and user verification".into(),
            (true, false) => "user presence (touch)".into(),
            (false, true) => "user verification".into(),
            (false, false) => "nothing".into(),
        }
    }
}

/// The requirements for a login by a security key whose authorized_keys
/// line (or certificate, merged with the line that admitted it) carries
/// `options`, under the server's `PubkeyAuthOptions`.
pub fn required(server: PubkeyAuthOptions, options: &KeyOptions) -> Required {
    Required {
        presence: server.touch_required || !options.no_touch_required,
        verification: server.verify_required || options.verify_required,
    }
}

/// What the server knows of a signature's flags.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flags {
    /// The flags and counter the signature carried (already verified).
    Seen { flags: u8, counter: u32 },
    /// The SSH library verified the signature but did not say what it
    /// carried (russh 0.65).
    Hidden,
}

/// Why a security-key signature does not do.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error(
        "user presence (authenticator touch) requirement not met (signature flags 0x{flags:02x})"
    )]
    NoPresence { flags: u8 },
    #[error("user verification requirement not met (signature flags 0x{flags:02x})")]
    NoVerification { flags: u8 },
    #[error(
        "this login requires {}, and skiffd cannot check a security key's signature flags \
         (its SSH library, russh, does not pass them on), so it admits a security key only \
         where none is required (no-touch-required, no verify-required, PubkeyAuthOptions none)",
        needs.names()
    )]
    FlagsHidden { needs: Required },
}

/// Whether a signature with `flags` meets `needs`. Nothing required:
/// always (sshd does not look at the flags then either).
pub fn check(needs: Required, flags: Flags) -> Result<(), Refusal> {
    if !needs.any() {
        return Ok(());
    }
    let flags = match flags {
        Flags::Seen { flags, .. } => flags,
        Flags::Hidden => return Err(Refusal::FlagsHidden { needs }),
    };
    if needs.presence && flags & USER_PRESENCE == 0 {
        return Err(Refusal::NoPresence { flags });
    }
    if needs.verification && flags & USER_VERIFICATION == 0 {
        return Err(Refusal::NoVerification { flags });
    }
    Ok(())
}

/// The debug line sshd logs for a security-key signature it verified.
pub fn debug_line(flags: Flags) -> String {
    match flags {
        Flags::Seen { flags, counter } => {
            format!("sk_counter = {counter}, sk_flags = 0x{flags:02x}")
        }
        Flags::Hidden => {
            "sk_counter and sk_flags are not known (russh does not pass them on)".into()
        }
    }
}

/// Whether `algorithm` (a key type or signature algorithm name, plain or
/// certificate) is a security key's.
pub fn is_security_key(algorithm: &str) -> bool {
    algorithm.starts_with("sk-") || algorithm.starts_with("webauthn-sk-")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(no_touch_required: bool, verify_required: bool) -> KeyOptions {
        KeyOptions {
            no_touch_required,
            verify_required,
            ..KeyOptions::default()
        }
    }

    const TOUCH: PubkeyAuthOptions = PubkeyAuthOptions {
        touch_required: true,
        verify_required: false,
    };
    const VERIFY: PubkeyAuthOptions = PubkeyAuthOptions {
        touch_required: false,
        verify_required: true,
    };

    #[test]
    fn parses_as_sshd() {
        let p = |s: &str| PubkeyAuthOptions::parse(&s.split_whitespace().collect::<Vec<_>>());
        assert_eq!(p("none"), Ok(PubkeyAuthOptions::default()));
        assert_eq!(p("touch-required"), Ok(TOUCH));
        assert_eq!(p("None Verify-Required"), Ok(VERIFY));
        let both = p("verify-required touch-required").unwrap();
        assert!(both.touch_required && both.verify_required);
        assert_eq!(both.dump(), "touch-required verify-required");
        assert_eq!(PubkeyAuthOptions::default().dump(), "none");
        assert_eq!(p(""), Err(OptionsError::Empty));
        assert_eq!(
            p("touch-required bogus"),
            Err(OptionsError::Unsupported("bogus".into()))
        );
    }

    #[test]
    fn presence_is_required_unless_the_line_waives_it() {
        let default = PubkeyAuthOptions::default();
        let need = |server, l: &KeyOptions| required(server, l);
        assert_eq!(
            need(default, &line(false, false)),
            Required {
                presence: true,
                verification: false
            }
        );
        assert!(!need(default, &line(true, false)).any());
        // touch-required voids the line's waiver.
        assert!(need(TOUCH, &line(true, false)).presence);
        // verify-required from either side.
        assert!(need(default, &line(true, true)).verification);
        assert!(need(VERIFY, &line(true, false)).verification);
        assert!(!need(VERIFY, &line(true, false)).presence);
    }

    #[test]
    fn seen_flags_are_checked() {
        let seen = |flags| Flags::Seen { flags, counter: 7 };
        let presence = Required {
            presence: true,
            verification: false,
        };
        let both = Required {
            presence: true,
            verification: true,
        };
        let verification = Required {
            presence: false,
            verification: true,
        };
        assert_eq!(check(presence, seen(0x01)), Ok(()));
        assert_eq!(
            check(presence, seen(0x00)),
            Err(Refusal::NoPresence { flags: 0 })
        );
        // Other bits (resident key 0x20) change nothing.
        assert_eq!(
            check(presence, seen(0x24)),
            Err(Refusal::NoPresence { flags: 0x24 })
        );
        assert_eq!(check(both, seen(0x05)), Ok(()));
        assert_eq!(
            check(both, seen(0x01)),
            Err(Refusal::NoVerification { flags: 0x01 })
        );
        assert_eq!(check(verification, seen(0x04)), Ok(()));
        assert!(check(verification, seen(0x01)).is_err());
        let nothing = Required {
            presence: false,
            verification: false,
        };
        assert_eq!(check(nothing, seen(0x00)), Ok(()));
        let text = check(presence, seen(0x00)).unwrap_err().to_string();
        assert!(
            text.contains("user presence") && text.contains("0x00"),
            "{text}"
        );
        assert_eq!(debug_line(seen(0x05)), "sk_counter = 7, sk_flags = 0x05");
    }

    #[test]
    fn hidden_flags_pass_only_where_nothing_is_required() {
        let nothing = Required {
            presence: false,
            verification: false,
        };
        assert_eq!(check(nothing, Flags::Hidden), Ok(()));
        for needs in [
            Required {
                presence: true,
                verification: false,
            },
            Required {
                presence: false,
                verification: true,
            },
            Required {
                presence: true,
                verification: true,
            },
        ] {
            let refusal = check(needs, Flags::Hidden).unwrap_err();
            assert_eq!(refusal, Refusal::FlagsHidden { needs });
            let text = refusal.to_string();
            assert!(text.contains("no-touch-required"), "{text}");
        }
    }

    #[test]
    fn security_key_algorithms() {
        assert!(is_security_key("sk-ssh-ed25519@openssh.com"));
        assert!(is_security_key(
            "sk-ecdsa-sha2-nistp256-cert-v01@openssh.com"
        ));
        assert!(is_security_key(
            "webauthn-sk-ecdsa-sha2-nistp256@openssh.com"
        ));
        assert!(!is_security_key("ssh-ed25519"));
        assert!(!is_security_key("ecdsa-sha2-nistp256-cert-v01@openssh.com"));
    }
}
