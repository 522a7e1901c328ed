//! The execution slots of one server (`--max-concurrent`), handed out in turn between sessions.
//!
//! A FIFO semaphore served calls in the order they came, whoever sent them: one session that
//! queued 64 calls behind 4 long ones (a call may set its timeout up to a day) made every other
//! session's call wait behind all of them, or be refused outright once the queue was full
//! (stop 60's probe). Here each session waits in a line of its own, a freed slot goes to the
//! next session in turn that has a call waiting, and (over HTTP, where sessions are many) a
//! session may hold at most [`MAX_WAITING_PER_SESSION`] waiting calls, so that one session
//! cannot fill the server's queue either. A stdio server has one session: its line is the
//! server's whole queue.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use tokio::sync::oneshot;

/// Most calls one session of an HTTP server may have waiting for a slot at once (the server's
/// whole queue holds `handler::MAX_QUEUED_CALLS`).
pub(crate) const MAX_WAITING_PER_SESSION: usize = 16;

/// Why no slot was given.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NoSlot {
    /// The server is stopping: no call gets a slot any more.
    Closed,
    /// This session already has as many calls waiting as one may.
    SessionQueueFull,
}

/// The slots and the sessions waiting for them.
pub(crate) struct FairSlots {
    state: Mutex<State>,
    /// Most waiting calls per session.
    per_session: usize,
}

#[derive(Default)]
struct State {
    free: usize,
    closed: bool,
    next_ticket: u64,
    /// Sessions with calls waiting, in the order they get the next slots.
    turns: VecDeque<u64>,
    /// Each session's waiting calls, oldest first.
    waiting: HashMap<u64, VecDeque<(u64, oneshot::Sender<SlotPermit>)>>,
}

/// One slot, held while an execution runs; dropping it hands it to the next session in turn.
pub(crate) struct SlotPermit {
    slots: Option<Arc<FairSlots>>,
}

impl Drop for SlotPermit {
    fn drop(&mut self) {
        if let Some(slots) = self.slots.take() {
            FairSlots::release(&slots);
        }
    }
}

impl FairSlots {
    /// `n` slots, all free, for which a session may have `per_session` calls waiting.
    pub(crate) fn new(n: usize, per_session: usize) -> Arc<Self> {
        Arc::new(FairSlots {
            state: Mutex::new(State {
                free: n,
                ..State::default()
            }),
            per_session,
        })
    }

    /// Most waiting calls per session.
    pub(crate) fn per_session(&self) -> usize {
        self.per_session
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A slot now, if one is free and nobody waits for one.
    pub(crate) fn try_acquire(self: &Arc<Self>) -> Result<Option<SlotPermit>, NoSlot> {
        let mut state = self.lock();
        if state.closed {
            return Err(NoSlot::Closed);
        }
        if state.free > 0 && state.turns.is_empty() {
            state.free -= 1;
            return Ok(Some(SlotPermit {
                slots: Some(Arc::clone(self)),
            }));
        }
        Ok(None)
    }

    /// Waits in `session`'s line for a slot. Dropping the future gives up the place; a slot
    /// handed to it in the meantime goes on to the next in turn.
    pub(crate) fn acquire(
        self: &Arc<Self>,
        session: u64,
    ) -> Result<impl std::future::Future<Output = Result<SlotPermit, NoSlot>>, NoSlot> {
        let (tx, rx) = oneshot::channel();
        let ticket = {
            let mut state = self.lock();
            if state.closed {
                return Err(NoSlot::Closed);
            }
            if state.free > 0 && state.turns.is_empty() {
                state.free -= 1;
                let permit = SlotPermit {
                    slots: Some(Arc::clone(self)),
                };
                // The receiver is still here: the send cannot fail.
                let _ = tx.send(permit);
                None
            } else {
                let state = &mut *state;
                let line = state.waiting.entry(session).or_default();
                if line.len() >= self.per_session {
                    return Err(NoSlot::SessionQueueFull);
                }
                let ticket = state.next_ticket;
                state.next_ticket += 1;
                line.push_back((ticket, tx));
                if !state.turns.contains(&session) {
                    state.turns.push_back(session);
                }
                Some(ticket)
            }
        };
        let place = ticket.map(|ticket| Place {
            slots: Arc::clone(self),
            session,
            ticket,
        });
        Ok(async move {
            let got = rx.await.map_err(|_| NoSlot::Closed);
            drop(place);
            got
        })
    }

    /// Hands a freed slot to the next session in turn with a call still waiting, else marks it
    /// free.
    fn release(slots: &Arc<Self>) {
        let mut permit = SlotPermit {
            slots: Some(Arc::clone(slots)),
        };
        let mut state = slots.lock();
        while let Some(session) = state.turns.pop_front() {
            let Some(line) = state.waiting.get_mut(&session) else {
                continue;
            };
            let Some((_, tx)) = line.pop_front() else {
                state.waiting.remove(&session);
                continue;
            };
            if line.is_empty() {
                state.waiting.remove(&session);
            } else {
                state.turns.push_back(session);
            }
            match tx.send(permit) {
                Ok(()) => return,
                // That call stopped waiting: the next one gets it.
                Err(back) => permit = back,
            }
        }
        if !state.closed {
            state.free += 1;
        }
        // Counted as free above; it must not be released again.
        permit.slots = None;
    }

    /// Refuses every waiting call and every later one: the server is stopping.
    pub(crate) fn close(&self) {
        let mut state = self.lock();
        state.closed = true;
        state.turns.clear();
        // Dropping the senders wakes each waiter with "closed".
        state.waiting.clear();
    }
}

/// A waiting call's place in its session's line, removed when the call stops waiting.
struct Place {
    slots: Arc<FairSlots>,
    session: u64,
    ticket: u64,
}

impl Drop for Place {
    fn drop(&mut self) {
        let mut state = self.slots.lock();
        let State { waiting, turns, .. } = &mut *state;
        if let Some(line) = waiting.get_mut(&self.session) {
            line.retain(|(t, _)| *t != self.ticket);
            if line.is_empty() {
                waiting.remove(&self.session);
                turns.retain(|s| *s != self.session);
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn a_freed_slot_goes_to_the_next_session_in_turn_not_to_the_longest_line() {
        let slots = FairSlots::new(1, MAX_WAITING_PER_SESSION);
        let running = slots.try_acquire().unwrap().expect("a free slot");
        // Session 1 queues five calls, then session 2 one.
        let mut a = Vec::new();
        for _ in 0..5 {
            a.push(tokio::spawn(slots.acquire(1).unwrap()));
        }
        tokio::task::yield_now().await;
        let b = tokio::spawn(slots.acquire(2).unwrap());
        tokio::task::yield_now().await;
        drop(running);
        // Session 1's first call got the slot (its turn came first)...
        let first = tokio::time::timeout(Duration::from_secs(5), a.remove(0))
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        drop(first);
        // ...and the next slot goes to session 2, ahead of session 1's other four.
        let second = tokio::time::timeout(Duration::from_secs(5), b)
            .await
            .expect("session 2 waited behind session 1's whole line")
            .unwrap()
            .unwrap();
        assert!(a.iter().all(|t| !t.is_finished()));
        drop(second);
        for t in a {
            drop(
                tokio::time::timeout(Duration::from_secs(5), t)
                    .await
                    .unwrap()
                    .unwrap()
                    .unwrap(),
            );
        }
        // Every slot came back.
        assert!(slots.try_acquire().unwrap().is_some());
    }

    #[tokio::test]
    async fn one_session_cannot_fill_the_queue_and_a_call_that_gives_up_loses_no_slot() {
        let slots = FairSlots::new(1, MAX_WAITING_PER_SESSION);
        let running = slots.try_acquire().unwrap().unwrap();
        let mut waiting = Vec::new();
        for _ in 0..MAX_WAITING_PER_SESSION {
            waiting.push(slots.acquire(7).unwrap());
        }
        assert_eq!(slots.acquire(7).err(), Some(NoSlot::SessionQueueFull));
        assert!(
            slots.acquire(8).is_ok(),
            "another session still gets a place"
        );
        // Every waiter gives up; the slot freed after is free again, not lost to them.
        drop(waiting);
        drop(running);
        assert!(slots.try_acquire().unwrap().is_some());
        slots.close();
        assert_eq!(slots.try_acquire().err(), Some(NoSlot::Closed));
    }
}
