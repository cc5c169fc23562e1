//! Authentication: MQTT 5 enhanced authentication (spec §4.12) as pluggable methods.
//!
//! A method is an [`Authenticator`] registered under its name in an [`AuthRegistry`]. The
//! connection drives the exchange (CONNECT → AUTH 0x18 … → CONNACK, and re-authentication with
//! AUTH 0x19 after CONNACK); the authenticator only decides each step. Steps are synchronous;
//! a method whose steps are expensive (password hashing, SCRAM iterations) says so through
//! [`Authenticator::is_expensive`] and the connection then runs them on tokio's blocking pool,
//! so they never stall the runtime.

pub(crate) mod acl;
pub(crate) mod acl_slot;
pub(crate) mod credential_file;
pub(crate) mod jwt;
pub(crate) mod login;
pub(crate) mod password;
pub(crate) mod principal;

use std::any::Any;
use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use bytes::Bytes;
use parking_lot::RwLock;
use thiserror::Error;

use crate::codec::ReasonCode;

pub(crate) mod scram;
pub(crate) mod scram_file;
pub(crate) mod source;
pub(crate) mod throttle;

/// Method-specific state carried from one step of an exchange to the next (e.g. the server
/// nonce of a challenge). Boxed `Any` so the registry can hold methods of different types.
pub type AuthState = Box<dyn Any + Send>;

/// The outcome of one authentication step.
pub enum AuthStep {
    /// Authenticated; the optional data goes to the client in CONNACK (or the final AUTH of a
    /// re-authentication) as Authentication Data.
    Success(Option<Bytes>),
    /// Authenticated as `user` (a method that names its user, as SCRAM does): like
    /// `Success`, and `user` becomes the session's identity for the ACL (as a CONNECT user
    /// name checked against the password file would).
    Authenticated {
        /// Authentication Data for the client, as with `Success`.
        data: Option<Bytes>,
        /// The user the exchange proved the client to be.
        user: String,
    },
    /// Another round is needed: `data` goes to the client in AUTH 0x18 and `state` comes back
    /// with the client's answer.
    Continue {
        /// Authentication Data for the client.
        data: Option<Bytes>,
        /// What the method needs to judge the answer.
        state: AuthState,
    },
    /// Refused, with the reason for CONNACK (e.g. 0x87 Not authorized, 0x86 Bad user name or
    /// password); after CONNACK (re-authentication) codes DISCONNECT cannot carry become 0x87.
    Fail(ReasonCode),
}

impl std::fmt::Debug for AuthStep {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AuthStep::Success(data) => f.debug_tuple("Success").field(data).finish(),
            AuthStep::Authenticated { data, user } => f
                .debug_struct("Authenticated")
                .field("data", data)
                .field("user", user)
                .finish(),
            AuthStep::Continue { data, .. } => f
                .debug_struct("Continue")
                .field("data", data)
                .finish_non_exhaustive(),
            AuthStep::Fail(code) => f.debug_tuple("Fail").field(code).finish(),
        }
    }
}

/// One enhanced authentication method (the value of the v5 Authentication Method property).
///
/// Implementations must not panic on client data: everything they receive comes from the
/// network.
pub trait Authenticator: Send + Sync + 'static {
    /// The method name clients put in CONNECT (e.g. `SCRAM-SHA-256`).
    fn method(&self) -> &str;

    /// First step, with the Authentication Data of CONNECT (or of a re-authentication AUTH).
    fn start(&self, client_id: &str, data: Option<Bytes>) -> AuthStep;

    /// Next step, with the state returned by the previous one and the client's AUTH data.
    fn continue_(&self, state: AuthState, data: Option<Bytes>) -> AuthStep;

    /// True if a step may take long enough to stall other connections (key derivation,
    /// password hashing): the connection then runs steps on the blocking thread pool.
    fn is_expensive(&self) -> bool {
        false
    }

    /// The user an exchange in progress claims to be, once a step has read it (SCRAM's
    /// client-first-message), before any proof is judged: the handshake asks the failed-login
    /// limits with it and counts a failed exchange against it and the address, as it does for
    /// passwords (issue 35: otherwise a method that names its user is an unthrottled way to
    /// guess). `None` (the default): the method names no user; its exchanges are not
    /// counted (such a method, an embedder's, keeps its own limits).
    fn claimed_user(&self, _state: &AuthState) -> Option<String> {
        None
    }
}

/// Why a method could not be registered.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum RegistryError {
    /// Two authenticators claimed the same method name.
    #[error("authentication method {0:?} is already registered")]
    Duplicate(String),
    /// The name is not usable as an MQTT UTF-8 string property.
    #[error("authentication method name must be 1 to 65535 bytes")]
    BadName,
}

/// The enhanced authentication methods the broker offers, keyed by method name.
///
/// Read on every CONNECT with an Authentication Method, written only at start-up (or by tests),
/// hence a read-write lock.
#[derive(Default)]
pub struct AuthRegistry {
    methods: RwLock<HashMap<String, Arc<dyn Authenticator>>>,
}

impl AuthRegistry {
    /// An empty registry: every Authentication Method is refused with 0x8C.
    pub fn new() -> AuthRegistry {
        AuthRegistry::default()
    }

    /// Offers `authenticator` under its method name.
    ///
    /// # Errors
    ///
    /// `RegistryError::BadName` for an empty method name or one longer than 65,535 bytes;
    /// `RegistryError::Duplicate` when the name is offered already.
    pub fn register(&self, authenticator: Arc<dyn Authenticator>) -> Result<(), RegistryError> {
        let name = authenticator.method().to_owned();
        if name.is_empty() || name.len() > usize::from(u16::MAX) {
            return Err(RegistryError::BadName);
        }
        let mut methods = self.methods.write();
        if methods.contains_key(&name) {
            return Err(RegistryError::Duplicate(name));
        }
        methods.insert(name, authenticator);
        Ok(())
    }

    /// The authenticator for `method`, if offered.
    pub fn get(&self, method: &str) -> Option<Arc<dyn Authenticator>> {
        self.methods.read().get(method).cloned()
    }

    /// True when no method is offered.
    pub fn is_empty(&self) -> bool {
        self.methods.read().is_empty()
    }
}

impl std::fmt::Debug for AuthRegistry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let methods = self.methods.read();
        f.debug_set().entries(methods.keys()).finish()
    }
}

/// A step in progress: resolves to the method's verdict.
pub(crate) type PendingStep = Pin<Box<dyn Future<Output = AuthStep> + Send>>;

/// What a step is asked to do.
#[derive(Debug)]
pub(crate) enum StepInput {
    /// [`Authenticator::start`] for this client id.
    Start(String),
    /// [`Authenticator::continue_`] with the state of the previous step.
    Continue(AuthState),
}

/// Runs one step: inline for cheap methods, on the blocking pool for expensive ones. A step
/// that panics (a bug in the method) counts as a failure, never as success.
pub(crate) fn run_step(
    auth: Arc<dyn Authenticator>,
    input: StepInput,
    data: Option<Bytes>,
) -> PendingStep {
    let expensive = auth.is_expensive();
    let step = move || match input {
        StepInput::Start(client_id) => auth.start(&client_id, data),
        StepInput::Continue(state) => auth.continue_(state, data),
    };
    if expensive {
        let handle = tokio::task::spawn_blocking(step);
        Box::pin(async move {
            handle
                .await
                .unwrap_or(AuthStep::Fail(ReasonCode::UNSPECIFIED_ERROR))
        })
    } else {
        let verdict = std::panic::catch_unwind(std::panic::AssertUnwindSafe(step))
            .unwrap_or(AuthStep::Fail(ReasonCode::UNSPECIFIED_ERROR));
        Box::pin(std::future::ready(verdict))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Fixed(&'static str, bool);

    impl Authenticator for Fixed {
        fn method(&self) -> &str {
            self.0
        }
        fn start(&self, _client_id: &str, data: Option<Bytes>) -> AuthStep {
            assert!(data.as_deref() != Some(b"boom"), "buggy method");
            AuthStep::Continue {
                data,
                state: Box::new(7u32),
            }
        }
        fn continue_(&self, state: AuthState, _data: Option<Bytes>) -> AuthStep {
            match state.downcast::<u32>() {
                Ok(n) if *n == 7 => AuthStep::Success(None),
                _ => AuthStep::Fail(ReasonCode::NOT_AUTHORIZED),
            }
        }
        fn is_expensive(&self) -> bool {
            self.1
        }
    }

    #[test]
    fn registry_refuses_duplicates_and_empty_names() {
        let r = AuthRegistry::new();
        assert!(r.is_empty());
        r.register(Arc::new(Fixed("X", false))).expect("first");
        assert_eq!(
            r.register(Arc::new(Fixed("X", true))),
            Err(RegistryError::Duplicate("X".into()))
        );
        assert_eq!(
            r.register(Arc::new(Fixed("", false))),
            Err(RegistryError::BadName)
        );
        assert!(r.get("X").is_some());
        assert!(r.get("x").is_none(), "method names are case-sensitive");
    }

    #[tokio::test]
    async fn steps_run_inline_or_on_the_blocking_pool() {
        for expensive in [false, true] {
            let auth: Arc<dyn Authenticator> = Arc::new(Fixed("X", expensive));
            let first = run_step(auth.clone(), StepInput::Start("c".into()), None).await;
            let AuthStep::Continue { state, .. } = first else {
                panic!("{first:?}")
            };
            let second = run_step(auth.clone(), StepInput::Continue(state), None).await;
            assert!(matches!(second, AuthStep::Success(None)), "{second:?}");
            let panicked = run_step(auth, StepInput::Start("c".into()), Some("boom".into())).await;
            assert!(
                matches!(panicked, AuthStep::Fail(ReasonCode::UNSPECIFIED_ERROR)),
                "{panicked:?}"
            );
        }
    }
}
