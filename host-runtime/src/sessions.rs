//! Sessions made while the host runs: a client asks (`run.chatNewSession`, an ACP
//! client's `session/new`), the embedder's [`SessionMaker`] makes one on the host's
//! thread, with the host and its agents at hand.

use std::any::Any;

use host_core::{Agent, Host, NewSession};
use timeline_core::key::SessionId;

/// An agent the runtime runs, which a [`SessionMaker`] can find by its type.
pub(crate) trait RuntimeAgent: Agent + Send {
    fn as_any_mut(&mut self) -> &mut dyn Any;
}

impl<A: Agent + Send + 'static> RuntimeAgent for A {
    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }
}

/// The runtime's agents, for a [`SessionMaker`] to tell about a new session.
pub struct Agents<'a> {
    pub(crate) agents: &'a mut [Box<dyn RuntimeAgent>],
}

impl std::fmt::Debug for Agents<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Agents")
            .field("agents", &self.agents.len())
            .finish()
    }
}

impl Agents<'_> {
    /// The first agent of type `A` added to the builder, if any.
    pub fn get_mut<A: Agent + 'static>(&mut self) -> Option<&mut A> {
        self.agents
            .iter_mut()
            .find_map(|a| a.as_any_mut().downcast_mut::<A>())
    }

    /// How many agents the runtime runs.
    pub fn len(&self) -> usize {
        self.agents.len()
    }

    /// True when the runtime runs no agent.
    pub fn is_empty(&self) -> bool {
        self.agents.is_empty()
    }
}

/// Makes the sessions clients ask for ([`crate::RuntimeBuilder::sessions`]), on the
/// host's thread: it picks the session's ID, tells the agent that will serve it (found
/// with [`Agents::get_mut`]), adds it to the host ([`Host::add_session`], with its
/// history source), and returns the ID. An `Err` is the refusal the client reads
/// (`SESSION_NOT_CREATED` on the wire). A session named but not added to the host is
/// refused too, never answered.
///
/// Any `FnMut(&NewSession, &mut Host<O, V>, &mut Agents) -> Result<SessionId, String>`
/// is one.
pub trait SessionMaker<O, V>: Send {
    /// Makes the session `request` asks for, or says why not.
    ///
    /// # Errors
    ///
    /// Why no session was made, in words for the client.
    fn make(
        &mut self,
        request: &NewSession,
        host: &mut Host<O, V>,
        agents: &mut Agents<'_>,
    ) -> Result<SessionId, String>;
}

impl<O, V, F> SessionMaker<O, V> for F
where
    F: FnMut(&NewSession, &mut Host<O, V>, &mut Agents<'_>) -> Result<SessionId, String> + Send,
{
    fn make(
        &mut self,
        request: &NewSession,
        host: &mut Host<O, V>,
        agents: &mut Agents<'_>,
    ) -> Result<SessionId, String> {
        self(request, host, agents)
    }
}
