//! Which forwardings skiffd allows: `AllowTcpForwarding`,
//! `AllowStreamLocalForwarding`, `AllowAgentForwarding`,
//! `DisableForwarding`, `PermitOpen`, `PermitListen` and `GatewayPorts` from
//! the server's settings, then the key's own `no-port-forwarding`,
//! `permitopen` and `permitlisten` (or a certificate without
//! `permit-port-forwarding`). Pure data and checks; the handler does the
//! connecting and listening (see [`crate::forward_relay`]).

use skiff_proto::authorized_keys::{split_host_port, KeyOptions};
use skiff_proto::pattern::wildcard_match;

/// One `host:port` entry of `PermitOpen` or `PermitListen`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PermitEntry {
    /// `*` for any host; for `PermitListen` a pattern.
    host: String,
    /// `None` for `*`, any port.
    port: Option<u16>,
}

impl PermitEntry {
    /// Parses `host:port`, `[v6]:port`, or (when `host_optional`, as for
    /// listening) a bare `port` meaning any host. Host and port may be `*`.
    pub fn parse(spec: &str, host_optional: bool) -> Result<PermitEntry, String> {
        let bad = || {
            if host_optional {
                format!("bad entry {spec:?}: expected [host:]port, host and port may be *")
            } else {
                format!("bad entry {spec:?}: expected host:port, host and port may be *")
            }
        };
        let (host, port) = split_host_port(spec).ok_or_else(bad)?;
        let host = match host {
            Some(h) => h.to_ascii_lowercase(),
            None if host_optional => "*".to_string(),
            None => return Err(bad()),
        };
        let port = match port {
            "*" => None,
            p => Some(p.parse().map_err(|_| bad())?),
        };
        Ok(PermitEntry { host, port })
    }

    fn port_matches(&self, port: u32) -> bool {
        self.port.is_none_or(|p| u32::from(p) == port)
    }
}

/// As sshd_config writes an entry (`host:port`, `[v6]:port`, `*`), the
/// way `skiffd -T` prints it.
impl std::fmt::Display for PermitEntry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.host.contains(':') {
            true => write!(f, "[{}]:", self.host)?,
            false => write!(f, "{}:", self.host)?,
        }
        match self.port {
            Some(port) => write!(f, "{port}"),
            None => f.write_str("*"),
        }
    }
}

/// `any`, `none`, or the entries separated by spaces, as sshd_config
/// writes them.
impl std::fmt::Display for PermitList {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PermitList::Any => f.write_str("any"),
            PermitList::None => f.write_str("none"),
            PermitList::Only(entries) => {
                let words: Vec<String> = entries.iter().map(ToString::to_string).collect();
                f.write_str(&words.join(" "))
            }
        }
    }
}

/// `PermitOpen` / `PermitListen`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum PermitList {
    #[default]
    Any,
    None,
    Only(Vec<PermitEntry>),
}

impl PermitList {
    /// Parses the values of one `PermitOpen` (`host_optional` false) or
    /// `PermitListen` line: `any`, `none`, or entries.
    pub fn parse(values: &[&str], host_optional: bool) -> Result<PermitList, String> {
        match values {
            [] => Err("needs any, none or host:port entries".into()),
            [v] if v.eq_ignore_ascii_case("any") => Ok(PermitList::Any),
            [v] if v.eq_ignore_ascii_case("none") => Ok(PermitList::None),
            entries => entries
                .iter()
                .map(|e| PermitEntry::parse(e, host_optional))
                .collect::<Result<_, _>>()
                .map(PermitList::Only),
        }
    }
}

/// `GatewayPorts`: where a remote forwarding listens.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum GatewayPorts {
    /// On loopback only, whatever the client asks.
    #[default]
    No,
    /// On every address, whatever the client asks.
    Yes,
    /// Where the client asks (`""` or `*` for every address).
    ClientSpecified,
}

impl GatewayPorts {
    pub fn parse(value: &str) -> Result<GatewayPorts, String> {
        match value.to_ascii_lowercase().as_str() {
            "no" => Ok(GatewayPorts::No),
            "yes" => Ok(GatewayPorts::Yes),
            "clientspecified" => Ok(GatewayPorts::ClientSpecified),
            _ => Err(format!(
                "GatewayPorts: expected no, yes or clientspecified, got {value:?}"
            )),
        }
    }
}

/// Where to listen for a remote forwarding.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BindTo {
    /// 127.0.0.1 and ::1.
    Loopback,
    /// 0.0.0.0 and ::.
    Everywhere,
    /// One address (or name) the client gave.
    Address(String),
}

/// The server's forwarding rules.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ForwardRules {
    /// `AllowTcpForwarding`: `local` allows `direct-tcpip` (ssh -L, -D, -W, -J).
    pub local: bool,
    /// `AllowTcpForwarding`: `remote` allows `tcpip-forward` (ssh -R).
    pub remote: bool,
    /// `AllowStreamLocalForwarding`: `local` allows `direct-streamlocal`
    /// (ssh -L to a Unix socket on the server).
    pub stream_local: bool,
    /// `AllowStreamLocalForwarding`: `remote` allows `streamlocal-forward`
    /// (ssh -R from a Unix socket on the server).
    pub stream_remote: bool,
    /// `StreamLocalBindMask`: the mode bits a forwarded socket does not get.
    pub bind_mask: u32,
    /// `StreamLocalBindUnlink`: replace an existing socket file.
    pub bind_unlink: bool,
    /// `AllowAgentForwarding`.
    pub agent: bool,
    /// `DisableForwarding yes` overrides everything else.
    pub disabled: bool,
    pub permit_open: PermitList,
    pub permit_listen: PermitList,
    pub gateway_ports: GatewayPorts,
}

impl Default for ForwardRules {
    fn default() -> Self {
        ForwardRules {
            local: true,
            remote: true,
            stream_local: true,
            stream_remote: true,
            bind_mask: 0o177,
            bind_unlink: false,
            agent: true,
            disabled: false,
            permit_open: PermitList::Any,
            permit_listen: PermitList::Any,
            gateway_ports: GatewayPorts::No,
        }
    }
}

/// Parses `AllowTcpForwarding` or `AllowStreamLocalForwarding` (named by
/// `keyword`): (`local`, `remote`) allowed.
pub fn parse_allow_forwarding(keyword: &str, value: &str) -> Result<(bool, bool), String> {
    match value.to_ascii_lowercase().as_str() {
        "yes" | "all" => Ok((true, true)),
        "no" => Ok((false, false)),
        "local" => Ok((true, false)),
        "remote" => Ok((false, true)),
        _ => Err(format!(
            "{keyword}: expected yes, all, no, local or remote, got {value:?}"
        )),
    }
}

/// Whether a key's `permitopen`/`permitlisten` values allow `host:port`.
/// No values means no restriction. Hosts compare as written (`*` for any),
/// as OpenSSH does for keys: no patterns, no name lookups.
fn key_allows(values: &[String], host: &str, port: u32) -> bool {
    values.is_empty()
        || values.iter().any(|v| {
            PermitEntry::parse(v, true).is_ok_and(|e| {
                e.port_matches(port) && (e.host == "*" || e.host.eq_ignore_ascii_case(host))
            })
        })
}

impl ForwardRules {
    /// Why agent forwarding is refused for a login with `key`'s options;
    /// `None` when it is allowed.
    pub fn agent_refusal(&self, key: &KeyOptions) -> Option<String> {
        if self.disabled {
            Some("DisableForwarding yes".into())
        } else if !self.agent {
            Some("AllowAgentForwarding no".into())
        } else if key.no_agent_forwarding {
            Some("the key (or certificate) does not allow agent forwarding".into())
        } else {
            None
        }
    }

    /// Why a connection to a Unix socket on this machine (a
    /// `direct-streamlocal` channel) is refused for a login with `key`'s
    /// options; `None` when it is allowed. PermitOpen does not apply, as in
    /// sshd.
    pub fn socket_open_refusal(&self, key: &KeyOptions) -> Option<String> {
        if self.disabled {
            Some("DisableForwarding yes".into())
        } else if !self.stream_local {
            Some("AllowStreamLocalForwarding does not allow local forwarding".into())
        } else if key.no_port_forwarding {
            Some("the key (or certificate) does not allow port forwarding".into())
        } else {
            None
        }
    }

    /// Why listening on a Unix socket for the client (`streamlocal-forward`)
    /// is refused for a login with `key`'s options; `None` when allowed.
    pub fn socket_listen_refusal(&self, key: &KeyOptions) -> Option<String> {
        if self.disabled {
            Some("DisableForwarding yes".into())
        } else if !self.stream_remote {
            Some("AllowStreamLocalForwarding does not allow remote forwarding".into())
        } else if key.no_port_forwarding {
            Some("the key (or certificate) does not allow port forwarding".into())
        } else {
            None
        }
    }

    /// Why a connection to `host:port` (a `direct-tcpip` channel) is
    /// refused for a login with `key`'s options; `None` when it is allowed.
    pub fn open_refusal(&self, key: &KeyOptions, host: &str, port: u32) -> Option<String> {
        if self.disabled {
            return Some("DisableForwarding yes".into());
        }
        if !self.local {
            return Some("AllowTcpForwarding does not allow local forwarding".into());
        }
        if key.no_port_forwarding {
            return Some("the key (or certificate) does not allow port forwarding".into());
        }
        if !(1..=65535).contains(&port) {
            return Some(format!("port {port} is not a TCP port"));
        }
        let server_allows = match &self.permit_open {
            PermitList::Any => true,
            PermitList::None => false,
            PermitList::Only(entries) => entries.iter().any(|e| {
                e.port_matches(port) && (e.host == "*" || e.host.eq_ignore_ascii_case(host))
            }),
        };
        if !server_allows {
            return Some(format!("PermitOpen does not list {host}:{port}"));
        }
        if !key_allows(&key.permit_open, host, port) {
            return Some(format!("the key's permitopen does not list {host}:{port}"));
        }
        None
    }

    /// Where to listen for a remote forwarding of `host:port` (`port` 0:
    /// any free port) asked for by account `uid` with `key`'s options, or
    /// why it is refused. Only root may listen below port 1024.
    pub fn listen_plan(
        &self,
        key: &KeyOptions,
        uid: u32,
        host: &str,
        port: u32,
    ) -> Result<BindTo, String> {
        if self.disabled {
            return Err("DisableForwarding yes".into());
        }
        if !self.remote {
            return Err("AllowTcpForwarding does not allow remote forwarding".into());
        }
        if key.no_port_forwarding {
            return Err("the key (or certificate) does not allow port forwarding".into());
        }
        if port > 65535 {
            return Err(format!("port {port} is not a TCP port"));
        }
        if port != 0 && port < 1024 && uid != 0 {
            return Err(format!("only root may listen on port {port} (below 1024)"));
        }
        let lower = host.to_ascii_lowercase();
        let server_allows = match &self.permit_listen {
            PermitList::Any => true,
            PermitList::None => false,
            PermitList::Only(entries) => entries
                .iter()
                .any(|e| e.port_matches(port) && wildcard_match(&e.host, &lower)),
        };
        if !server_allows {
            return Err(format!("PermitListen does not list {host}:{port}"));
        }
        let key_allows_listen = key.permit_listen.is_empty()
            || key.permit_listen.iter().any(|v| {
                PermitEntry::parse(v, true)
                    .is_ok_and(|e| e.port_matches(port) && wildcard_match(&e.host, &lower))
            });
        if !key_allows_listen {
            return Err(format!(
                "the key's permitlisten does not list {host}:{port}"
            ));
        }
        Ok(match self.gateway_ports {
            GatewayPorts::No => BindTo::Loopback,
            GatewayPorts::Yes => BindTo::Everywhere,
            GatewayPorts::ClientSpecified => match lower.as_str() {
                "" | "*" | "0.0.0.0" | "::" => BindTo::Everywhere,
                "localhost" => BindTo::Loopback,
                _ => BindTo::Address(host.to_string()),
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(opts: &str) -> KeyOptions {
        let line =
            format!("{opts} ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIAEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEB");
        skiff_proto::authorized_keys::parse_line(&line, 1)
            .expect("valid line")
            .expect("a key")
            .options
    }

    fn rules() -> ForwardRules {
        ForwardRules::default()
    }

    #[test]
    fn defaults_allow_both_directions_on_loopback() {
        let r = rules();
        assert_eq!(r.open_refusal(&KeyOptions::default(), "db", 5432), None);
        assert_eq!(
            r.listen_plan(&KeyOptions::default(), 1000, "", 8080),
            Ok(BindTo::Loopback)
        );
        assert_eq!(
            r.listen_plan(&KeyOptions::default(), 1000, "*", 0),
            Ok(BindTo::Loopback)
        );
    }

    #[test]
    fn allow_tcp_forwarding_values() {
        let parse = |v| parse_allow_forwarding("AllowTcpForwarding", v);
        assert_eq!(parse("ALL"), Ok((true, true)));
        assert_eq!(parse("local"), Ok((true, false)));
        assert_eq!(parse("remote"), Ok((false, true)));
        assert_eq!(parse("no"), Ok((false, false)));
        assert!(parse("sometimes")
            .unwrap_err()
            .contains("AllowTcpForwarding"));

        let mut r = rules();
        (r.local, r.remote) = (true, false);
        let k = KeyOptions::default();
        assert_eq!(r.open_refusal(&k, "db", 1), None);
        assert!(r.listen_plan(&k, 0, "", 8080).is_err());
        (r.local, r.remote) = (false, true);
        assert!(r.open_refusal(&k, "db", 1).is_some());
        assert!(r.listen_plan(&k, 0, "", 8080).is_ok());
    }

    #[test]
    fn agent_forwarding_rules() {
        let k = KeyOptions::default();
        assert_eq!(rules().agent_refusal(&k), None);
        assert!(rules().agent_refusal(&key("no-agent-forwarding")).is_some());
        assert!(rules().agent_refusal(&key("restrict")).is_some());
        assert_eq!(
            rules().agent_refusal(&key("restrict,agent-forwarding")),
            None
        );
        let off = ForwardRules {
            agent: false,
            ..rules()
        };
        assert!(off
            .agent_refusal(&k)
            .unwrap()
            .contains("AllowAgentForwarding"));
        let disabled = ForwardRules {
            disabled: true,
            ..rules()
        };
        assert!(disabled.agent_refusal(&k).unwrap().contains("Disable"));
    }

    #[test]
    fn unix_socket_forwarding_rules() {
        let k = KeyOptions::default();
        assert_eq!(rules().socket_open_refusal(&k), None);
        assert_eq!(rules().socket_listen_refusal(&k), None);
        let mut r = rules();
        (r.stream_local, r.stream_remote) = (false, true);
        assert!(r
            .socket_open_refusal(&k)
            .unwrap()
            .contains("AllowStreamLocalForwarding"));
        assert_eq!(r.socket_listen_refusal(&k), None);
        (r.stream_local, r.stream_remote) = (true, false);
        assert_eq!(r.socket_open_refusal(&k), None);
        assert!(r.socket_listen_refusal(&k).is_some());
        // TCP rules do not reach sockets, and the other way round.
        let r = ForwardRules {
            local: false,
            remote: false,
            permit_open: PermitList::None,
            ..rules()
        };
        assert_eq!(r.socket_open_refusal(&k), None);
        for opts in ["no-port-forwarding", "restrict"] {
            assert!(rules().socket_open_refusal(&key(opts)).is_some(), "{opts}");
            assert!(
                rules().socket_listen_refusal(&key(opts)).is_some(),
                "{opts}"
            );
        }
        let off = ForwardRules {
            disabled: true,
            ..rules()
        };
        assert!(off.socket_listen_refusal(&k).unwrap().contains("Disable"));
    }

    #[test]
    fn disable_forwarding_wins() {
        let r = ForwardRules {
            disabled: true,
            ..rules()
        };
        let k = KeyOptions::default();
        assert!(r.open_refusal(&k, "db", 1).unwrap().contains("Disable"));
        assert!(r.listen_plan(&k, 0, "", 1).unwrap_err().contains("Disable"));
    }

    #[test]
    fn key_restrictions() {
        let r = rules();
        for opts in ["no-port-forwarding", "restrict", "restrict,pty"] {
            let k = key(opts);
            assert!(r.open_refusal(&k, "db", 22).is_some(), "{opts}");
            assert!(r.listen_plan(&k, 1000, "", 8080).is_err(), "{opts}");
        }
        let k = key("restrict,port-forwarding");
        assert_eq!(r.open_refusal(&k, "db", 22), None);

        let k = key(r#"permitopen="db:5432",permitopen="[::1]:*""#);
        assert_eq!(r.open_refusal(&k, "db", 5432), None);
        assert_eq!(r.open_refusal(&k, "DB", 5432), None);
        assert_eq!(r.open_refusal(&k, "::1", 9), None);
        assert!(r.open_refusal(&k, "db", 5433).is_some());
        // Key entries are literal: no patterns, no lookups.
        assert!(r.open_refusal(&k, "db.example", 5432).is_some());
        assert!(r.open_refusal(&k, "127.0.0.1", 9).is_some());
        let k = key(r#"permitopen="db*:5432""#);
        assert!(r.open_refusal(&k, "db1", 5432).is_some());

        let k = key(r#"permitlisten="8080",permitlisten="localhost:9000""#);
        assert!(r.listen_plan(&k, 1000, "", 8080).is_ok());
        assert!(r.listen_plan(&k, 1000, "anything", 8080).is_ok());
        assert!(r.listen_plan(&k, 1000, "localhost", 9000).is_ok());
        assert!(r.listen_plan(&k, 1000, "", 9000).is_err());
        assert!(r.listen_plan(&k, 1000, "localhost", 0).is_err());
    }

    #[test]
    fn permit_open_lists() {
        let list = PermitList::parse(&["db:5432", "*:80", "cache:*"], false).unwrap();
        let r = ForwardRules {
            permit_open: list,
            ..rules()
        };
        let k = KeyOptions::default();
        assert_eq!(r.open_refusal(&k, "db", 5432), None);
        assert_eq!(r.open_refusal(&k, "anything", 80), None);
        assert_eq!(r.open_refusal(&k, "cache", 6379), None);
        assert!(r.open_refusal(&k, "db", 22).unwrap().contains("PermitOpen"));
        // Both the server's list and the key's must allow it.
        let k = key(r#"permitopen="cache:1""#);
        assert!(r.open_refusal(&k, "cache", 6379).unwrap().contains("key"));
        assert_eq!(r.open_refusal(&k, "cache", 1), None);

        let r = ForwardRules {
            permit_open: PermitList::parse(&["none"], false).unwrap(),
            ..rules()
        };
        assert!(r.open_refusal(&KeyOptions::default(), "db", 1).is_some());
        assert_eq!(PermitList::parse(&["ANY"], false), Ok(PermitList::Any));
        assert!(PermitList::parse(&["5432"], false).is_err());
        assert!(PermitList::parse(&["db:99999"], false).is_err());
        assert!(PermitList::parse(&[], false).is_err());
        assert!(PermitList::parse(&["db:"], false).is_err());
    }

    #[test]
    fn permit_listen_and_privileged_ports() {
        let r = ForwardRules {
            permit_listen: PermitList::parse(&["8080", "local*:9000"], true).unwrap(),
            ..rules()
        };
        let k = KeyOptions::default();
        assert!(r.listen_plan(&k, 1000, "", 8080).is_ok());
        assert!(r.listen_plan(&k, 1000, "localhost", 9000).is_ok());
        assert!(r.listen_plan(&k, 1000, "10.0.0.1", 9000).is_err());
        assert!(r.listen_plan(&k, 1000, "", 0).is_err());

        let r = rules();
        assert!(r
            .listen_plan(&k, 1000, "", 80)
            .unwrap_err()
            .contains("root"));
        assert!(r.listen_plan(&k, 0, "", 80).is_ok());
        assert!(r.listen_plan(&k, 1000, "", 0).is_ok());
        assert!(r.listen_plan(&k, 1000, "", 70000).is_err());
    }

    #[test]
    fn gateway_ports() {
        let k = KeyOptions::default();
        let with = |g| ForwardRules {
            gateway_ports: g,
            ..rules()
        };
        let r = with(GatewayPorts::Yes);
        assert_eq!(r.listen_plan(&k, 0, "localhost", 1), Ok(BindTo::Everywhere));
        let r = with(GatewayPorts::ClientSpecified);
        assert_eq!(r.listen_plan(&k, 0, "", 1), Ok(BindTo::Everywhere));
        assert_eq!(r.listen_plan(&k, 0, "*", 1), Ok(BindTo::Everywhere));
        assert_eq!(r.listen_plan(&k, 0, "localhost", 1), Ok(BindTo::Loopback));
        assert_eq!(
            r.listen_plan(&k, 0, "127.0.0.2", 1),
            Ok(BindTo::Address("127.0.0.2".into()))
        );
        assert!(GatewayPorts::parse("maybe").is_err());
        assert_eq!(
            GatewayPorts::parse("ClientSpecified"),
            Ok(GatewayPorts::ClientSpecified)
        );
    }
}
