//! The synchronous driver: carries out custody's agent effects against an
//! [`AgentAdapter`] that answers at once (tests, demos, simple embeddings).

use crate::adapter::{ReadHistoryRequest, StopRequest, TakeBackRequest};
use timeline_core::time::Millis;

use super::{Custody, CustodyEffect};
use crate::adapter::AgentAdapter;
use crate::store::OutboxStore;

impl<S: OutboxStore> Custody<S> {
    /// Carries out every pending effect against a synchronous `adapter` (answers at
    /// once) and returns the effects meant for the embedding itself (stop answers,
    /// thread-link clears, delivery republishes, refused take-backs, refused runs, store
    /// failures). Before that, the adapter's reclaim veto is asked for every active run.
    pub fn drive<A: AgentAdapter + ?Sized>(
        &mut self,
        adapter: &mut A,
        now: Millis,
    ) -> Vec<CustodyEffect> {
        let active: Vec<_> = self
            .runs
            .active_runs(now, &|_: &crate::ids::SessionId, _: &crate::ids::RunId| {
                true
            })
            .into_iter()
            .map(|(s, r)| (s, r.run_id))
            .collect();
        for (session, run) in active {
            let veto = adapter.vetoes_reclaim(&session, &run);
            self.set_veto(&session, &run, veto);
        }
        let mut out = Vec::new();
        while let Some(effect) = self.poll_effect() {
            match effect {
                CustodyEffect::Send(req) => {
                    let result = adapter.send(&req);
                    self.handle_send_result(req.attempt, result, now);
                }
                CustodyEffect::ReadHistory(ReadHistoryRequest {
                    attempt,
                    session,
                    operation_id,
                    ..
                }) => {
                    let read = adapter.read_history(&session, &operation_id);
                    self.handle_history_read(attempt, read, now);
                }
                CustodyEffect::Stop(StopRequest {
                    attempt,
                    session,
                    run,
                }) => {
                    let result = adapter.stop(&session, &run);
                    self.handle_stop_result(attempt, result, now);
                }
                CustodyEffect::TakeBack(TakeBackRequest {
                    attempt,
                    session,
                    operation_id,
                    acceptance,
                }) => {
                    let result = adapter.take_back(&session, &operation_id, &acceptance);
                    self.handle_take_back(attempt, result, now);
                }
                other => out.push(other),
            }
        }
        out
    }
}
