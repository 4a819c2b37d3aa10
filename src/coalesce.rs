//! Asking Redis once for many askers: [`Batcher`] sends the calls that arrive while one is in
//! flight together in the next call (opportunistic batching), and [`SingleFlight`] lets
//! concurrent askers of one fact share one answer. A leaf: it knows nothing of stock, Redis or
//! requests; the stores and the lifecycle build their batches and flights on it.
//!
//! Neither spawns a task, and by default neither waits on a timer: the first asker goes at
//! once (a batch of one at low load costs no latency), and whoever asks while a call is out is
//! answered by that call's successor, led by the first of them. A batcher for work off anyone's
//! path may linger ([`Batcher::with_linger`]): the first asker at an idle lane waits that long
//! for company before its call leaves. Both are cancellation-safe: an asker dropped mid-call
//! hands the lead on, and the askers it was leading are answered with [`Lost`].

use parking_lot::Mutex;
use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::hash::Hash;
use std::time::Instant;
use tokio::sync::oneshot;

/// The call that would have answered an asker was dropped before it was answered (its leader's
/// request went away): it may or may not have run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the batched call carrying this request was dropped before its answer")]
pub struct Lost;

/// What a waiting asker is told.
enum Message<I, O> {
    Answer(O),
    /// Lead the next call: this asker's own item first, then `others`.
    Lead {
        mine: I,
        others: Vec<Waiter<I, O>>,
    },
}

struct Waiter<I, O> {
    item: I,
    reply: oneshot::Sender<Message<I, O>>,
}

struct Lane<I, O> {
    /// A call of this lane is out (or its leader is being chosen).
    busy: bool,
    waiting: VecDeque<Waiter<I, O>>,
}

/// Opportunistic batching per key (a segment's stock key, say): the first item goes at once
/// in a call of its own; items arriving while a call of their key is out wait, and go together
/// (at most `max` of them, in arrival order) in the next one. One call per key is out at a
/// time. An asker whose future was dropped before its call left is left out of it.
pub struct Batcher<K, I, O> {
    lanes: Mutex<HashMap<K, Lane<I, O>>>,
    max: usize,
    /// Tests hold every lane (nothing leaves) to build one batch exactly.
    held: std::sync::atomic::AtomicBool,
    /// How long the first item at an idle lane waits for others before its call leaves (zero:
    /// it leaves at once).
    linger: std::time::Duration,
}

impl<K: Hash + Eq + Clone, I, O> Batcher<K, I, O> {
    pub fn new(max: usize) -> Self {
        Batcher {
            lanes: Mutex::new(HashMap::new()),
            max: max.max(1),
            held: Default::default(),
            linger: std::time::Duration::ZERO,
        }
    }

    /// The first item at an idle lane waits `linger` and takes the items that arrived meanwhile
    /// (up to `max` in all) into its call. For calls off a buyer's path only: it adds `linger` to
    /// the first item's time, and spares a call per item at low load.
    pub fn with_linger(mut self, linger: std::time::Duration) -> Self {
        self.linger = linger;
        self
    }

    /// Runs `item` in a call of `key`'s lane: `call` gets the items of one batch in order and
    /// answers each, in the same order (a shorter answer leaves the rest [`Lost`]).
    pub async fn submit<F, Fut>(&self, key: K, item: I, call: F) -> Result<O, Lost>
    where
        F: Fn(Vec<I>) -> Fut,
        Fut: Future<Output = Vec<O>>,
    {
        let queued = {
            let mut lanes = self.lanes.lock();
            let lane = lanes.entry(key.clone()).or_insert_with(|| Lane {
                busy: false,
                waiting: VecDeque::new(),
            });
            if lane.busy || self.held.load(std::sync::atomic::Ordering::Relaxed) {
                let (tx, rx) = oneshot::channel();
                lane.waiting.push_back(Waiter { item, reply: tx });
                Err(rx)
            } else {
                lane.busy = true;
                Ok(item)
            }
        };
        let idle = queued.is_ok();
        let (mine, mut others) = match queued {
            Ok(item) => (item, Vec::new()),
            Err(rx) => {
                let mut waiting = Waiting {
                    batcher: self,
                    key: key.clone(),
                    rx: Some(rx),
                };
                let message = waiting.rx.as_mut().expect("set above").await;
                waiting.rx = None;
                match message.map_err(|_| Lost)? {
                    Message::Answer(out) => return Ok(out),
                    Message::Lead { mine, others } => (mine, others),
                }
            }
        };
        // Leading: whatever happens to this future, the lane goes on (see `Leading::drop`).
        let _leading = Leading {
            batcher: self,
            key: key.clone(),
        };
        if idle && !self.linger.is_zero() {
            // The lane is busy meanwhile: whoever asks queues, and comes along.
            tokio::time::sleep(self.linger).await;
            let mut lanes = self.lanes.lock();
            if let Some(lane) = lanes.get_mut(&key) {
                let n = lane.waiting.len().min(self.max - 1);
                others = lane.waiting.drain(..n).collect();
            }
        }
        // Askers gone since the batch was formed are left out (one gone after this may still
        // have its item carried: as with a request dropped while its own call is out).
        let (items, replies): (Vec<I>, Vec<_>) = std::iter::once((mine, None))
            .chain(
                others
                    .into_iter()
                    .filter(|w| !w.reply.is_closed())
                    .map(|w| (w.item, Some(w.reply))),
            )
            .unzip();
        let mut answers = call(items).await.into_iter();
        let own = answers.next().ok_or(Lost);
        for (reply, answer) in replies.into_iter().skip(1).zip(answers) {
            if let Some(reply) = reply {
                let _ = reply.send(Message::Answer(answer));
            }
        }
        own
    }

    /// Hands `key`'s lane to the first asker still waiting (with the next batch), or frees it.
    fn hand_on(&self, key: &K) {
        let mut lanes = self.lanes.lock();
        let Some(lane) = lanes.get_mut(key) else {
            return;
        };
        if self.held.load(std::sync::atomic::Ordering::Relaxed) {
            lane.busy = false;
            return;
        }
        loop {
            lane.waiting.retain(|w| !w.reply.is_closed());
            let Some(first) = lane.waiting.pop_front() else {
                lanes.remove(key);
                return;
            };
            let n = lane.waiting.len().min(self.max - 1);
            let others: Vec<_> = lane.waiting.drain(..n).collect();
            match first.reply.send(Message::Lead {
                mine: first.item,
                others,
            }) {
                Ok(()) => return,
                // Gone between the check and the send: put the others back, try the next.
                Err(Message::Lead { others, .. }) => {
                    for w in others.into_iter().rev() {
                        lane.waiting.push_front(w);
                    }
                }
                Err(Message::Answer(_)) => unreachable!("sent a lead"),
            }
        }
    }

    /// Test seam: while held, nothing leaves; items queue in arrival order.
    #[doc(hidden)]
    pub fn hold(&self) {
        self.held.store(true, std::sync::atomic::Ordering::Relaxed);
    }

    /// Test seam: lets the held items go, each lane's in one batch (up to `max`).
    #[doc(hidden)]
    pub fn release(&self) {
        self.held.store(false, std::sync::atomic::Ordering::Relaxed);
        let keys: Vec<K> = {
            let mut lanes = self.lanes.lock();
            lanes
                .iter_mut()
                .filter(|(_, lane)| !lane.busy)
                .map(|(key, lane)| {
                    lane.busy = true;
                    key.clone()
                })
                .collect()
        };
        for key in keys {
            self.hand_on(&key);
        }
    }

    /// Test seam: items waiting in every lane.
    #[doc(hidden)]
    pub fn waiting(&self) -> usize {
        self.lanes.lock().values().map(|l| l.waiting.len()).sum()
    }
}

/// The leader's mark: dropped when its call is answered, or when its future is dropped
/// mid-call (the askers it led get [`Lost`] from their dropped senders); either way the lane
/// goes to the next asker.
struct Leading<'a, K: Hash + Eq + Clone, I, O> {
    batcher: &'a Batcher<K, I, O>,
    key: K,
}

impl<K: Hash + Eq + Clone, I, O> Drop for Leading<'_, K, I, O> {
    fn drop(&mut self) {
        self.batcher.hand_on(&self.key);
    }
}

/// A waiting asker's mark: dropped before its message was read (its request went away), it
/// closes its channel and, if the lead was handed to it meanwhile, puts the batch it was given
/// back at the head of the lane and hands the lead on, so a lane never stays busy with no one
/// leading it.
struct Waiting<'a, K: Hash + Eq + Clone, I, O> {
    batcher: &'a Batcher<K, I, O>,
    key: K,
    rx: Option<oneshot::Receiver<Message<I, O>>>,
}

impl<K: Hash + Eq + Clone, I, O> Drop for Waiting<'_, K, I, O> {
    fn drop(&mut self) {
        let Some(mut rx) = self.rx.take() else {
            return;
        };
        rx.close();
        if let Ok(Message::Lead { others, .. }) = rx.try_recv() {
            if let Some(lane) = self.batcher.lanes.lock().get_mut(&self.key) {
                for w in others.into_iter().rev() {
                    lane.waiting.push_front(w);
                }
            }
            self.batcher.hand_on(&self.key);
        }
    }
}

/// A flight out: when it left, and who waits for its answer.
struct Flight<O> {
    id: u64,
    left: Instant,
    waiting: Vec<oneshot::Sender<O>>,
}

/// One determination at a time per key: an asker joins a flight that left at or after
/// `fresh_from` (so its answer is no older than what the asker already knew), else asks itself,
/// and the askers that come while it is out share its answer. Askers needing something fresher
/// than the flight out ask on their own.
pub struct SingleFlight<K, O> {
    flights: Mutex<HashMap<K, Flight<O>>>,
    next_id: std::sync::atomic::AtomicU64,
}

impl<K: Hash + Eq + Clone, O: Clone> Default for SingleFlight<K, O> {
    fn default() -> Self {
        SingleFlight {
            flights: Mutex::new(HashMap::new()),
            next_id: Default::default(),
        }
    }
}

impl<K: Hash + Eq + Clone, O: Clone> SingleFlight<K, O> {
    /// `ask`'s answer, or that of a flight of `key` that left at or after `fresh_from`.
    pub async fn get<Fut>(&self, key: K, fresh_from: Instant, ask: impl FnOnce() -> Fut) -> O
    where
        Fut: Future<Output = O>,
    {
        let joined = {
            let mut flights = self.flights.lock();
            match flights.get_mut(&key) {
                Some(flight) if flight.left >= fresh_from => {
                    let (tx, rx) = oneshot::channel();
                    flight.waiting.push(tx);
                    Err(rx)
                }
                // None out, or one too old for this asker: this one goes, and askers after it
                // join it (as do those of the older flight: a fresher answer serves them too).
                out => {
                    let waiting = out.map(|f| std::mem::take(&mut f.waiting));
                    let id = self
                        .next_id
                        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    flights.insert(
                        key.clone(),
                        Flight {
                            id,
                            left: Instant::now(),
                            waiting: waiting.unwrap_or_default(),
                        },
                    );
                    Ok(id)
                }
            }
        };
        let id = match joined {
            Ok(id) => id,
            Err(rx) => {
                if let Ok(answer) = rx.await {
                    return answer;
                }
                // Its leader went away before answering: ask directly.
                return ask().await;
            }
        };
        let landing = Landing {
            flights: &self.flights,
            key,
            id,
        };
        let answer = ask().await;
        for tx in landing.take() {
            let _ = tx.send(answer.clone());
        }
        answer
    }
}

/// Removes a flight when it lands, or when its asker's future is dropped (its joiners then
/// ask directly).
struct Landing<'a, K: Hash + Eq, O> {
    flights: &'a Mutex<HashMap<K, Flight<O>>>,
    key: K,
    id: u64,
}

impl<K: Hash + Eq, O> Landing<'_, K, O> {
    /// This flight's askers, and the flight gone; nothing if a fresher flight replaced it
    /// (its askers moved to that one).
    fn take(&self) -> Vec<oneshot::Sender<O>> {
        let mut flights = self.flights.lock();
        match flights.get(&self.key) {
            Some(f) if f.id == self.id => flights
                .remove(&self.key)
                .map(|f| f.waiting)
                .unwrap_or_default(),
            _ => Vec::new(),
        }
    }
}

impl<K: Hash + Eq, O> Drop for Landing<'_, K, O> {
    fn drop(&mut self) {
        self.take();
    }
}

#[cfg(test)]
mod tests;
