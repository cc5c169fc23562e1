//! What the remote holds of a bridge's `in` subscriptions between its connections: whether a
//! reconnect asks for them again (issue 35; eighteenth adversarial pass, E4).

/// What the remote holds of the bridge's `in` subscriptions from earlier connections of a
/// run, so that a reconnect does not ask for them again where that would bring every
/// retained message under them again (MQTT-3.3.1-9). Asked on each reconnect that fetches
/// skipped messages, the remote sent them all again: they refilled the bridge's share for
/// good, the remote's next message was held behind them, and a retained message cleared
/// here came back (issue 35, found while mending the seventeenth pass's D7). Not asking on
/// every reconnect of a resumed session left the bridge with none after a client took its
/// client id on the remote with a fresh session (eighteenth pass, E4).
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct RemoteSubscriptions {
    /// The remote acknowledged them on a connection of this run.
    pub(super) acknowledged: bool,
    /// The last connection ended to fetch skipped messages (`pump::Ended::Resend`): the bridge
    /// reconnected at once, itself, so the remote's session is the one it subscribed in.
    pub(super) after_resend: bool,
}

impl RemoteSubscriptions {
    /// Whether the remote still holds them: they were acknowledged, the bridge reconnected
    /// only to fetch skipped messages, and the remote resumed the session (`session_present`).
    /// MQTT 3.1.1 has no Retain Handling: the bridge asks again unless this holds.
    pub(super) fn still_held(self, session_present: bool) -> bool {
        self.acknowledged && self.after_resend && session_present
    }
}
