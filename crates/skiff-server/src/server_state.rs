//! What every connection of one server shares: the settings as the server
//! read them (`Match` blocks may change them for a login, see the
//! handler), the lookup commands checked at start, the data plane's
//! outstanding stream tokens and the memory all connections hold for their
//! peers. Made once by `crate::listener` and handed to every connection.
//!
//! Not here: what one connection keeps (`crate::handler`), and what the
//! listener counts before a connection is handed over (MaxStartups,
//! descriptors).

use std::sync::Arc;

use crate::config::Settings;

/// State shared by every connection of one server.
pub struct ServerState {
    pub settings: Settings,
    /// `AuthorizedKeysCommand`, checked at start.
    pub keys_command: Option<crate::lookup_command::LookupCommand>,
    /// `AuthorizedPrincipalsCommand`, checked at start.
    pub principals_command: Option<crate::lookup_command::LookupCommand>,
    /// Outstanding data-plane stream tokens (each transfer's relay holds
    /// the registry too).
    pub registry: Arc<crate::stream_relay::Registry>,
    /// What all connections hold for their peers (`MaxServerQueue`).
    pub queues: Arc<crate::queue_budget::ServerQueue>,
    /// The `AuditLog`, when one is set.
    pub audit: Option<Arc<crate::audit_writer::AuditLog>>,
}
