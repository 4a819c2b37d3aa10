use super::*;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Semaphore;

/// A batch call that records each batch and answers once a permit is given.
struct Calls {
    batches: Mutex<Vec<Vec<u32>>>,
    gate: Semaphore,
}

impl Calls {
    fn new() -> Arc<Calls> {
        Arc::new(Calls {
            batches: Mutex::new(Vec::new()),
            gate: Semaphore::new(0),
        })
    }

    async fn call(&self, items: Vec<u32>) -> Vec<u32> {
        self.batches.lock().push(items.clone());
        self.gate.acquire().await.unwrap().forget();
        items.into_iter().map(|i| i * 10).collect()
    }

    fn batches(&self) -> Vec<Vec<u32>> {
        self.batches.lock().clone()
    }
}

/// Polls until `done` holds (every task here runs on this test's runtime).
async fn until(mut done: impl FnMut() -> bool) {
    for _ in 0..10_000 {
        if done() {
            return;
        }
        tokio::task::yield_now().await;
    }
    panic!("never came to pass");
}

#[tokio::test]
async fn the_first_item_goes_alone_and_those_arriving_meanwhile_go_together_in_order() {
    let batcher = Arc::new(Batcher::<&str, u32, u32>::new(3));
    let calls = Calls::new();
    let mut tasks = Vec::new();
    for i in 0..6u32 {
        let (b, c) = (batcher.clone(), calls.clone());
        tasks.push(tokio::spawn(async move {
            b.submit("lane", i, |items| c.call(items)).await
        }));
        // Each arrives in order.
        until(|| calls.batches().len() == 1 && batcher.waiting() == i as usize).await;
    }
    assert_eq!(calls.batches(), vec![vec![0]]);
    calls.gate.add_permits(1);
    // The next call carries the first three waiting (the bound), in arrival order.
    until(|| calls.batches().len() == 2).await;
    assert_eq!(calls.batches()[1], vec![1, 2, 3]);
    calls.gate.add_permits(2);
    let answers: Vec<u32> = futures_util::future::join_all(tasks)
        .await
        .into_iter()
        .map(|r| r.unwrap().unwrap())
        .collect();
    assert_eq!(answers, vec![0, 10, 20, 30, 40, 50]);
    assert_eq!(calls.batches()[2], vec![4, 5]);
    assert!(batcher.lanes.lock().is_empty(), "an idle lane is forgotten");
}

#[tokio::test]
async fn lanes_of_different_keys_do_not_wait_for_each_other() {
    let batcher = Arc::new(Batcher::<u8, u32, u32>::new(32));
    let calls = Calls::new();
    let (b, c) = (batcher.clone(), calls.clone());
    let a = tokio::spawn(async move { b.submit(1, 1, |items| c.call(items)).await });
    until(|| calls.batches().len() == 1).await;
    let (b, c) = (batcher.clone(), calls.clone());
    let other = tokio::spawn(async move { b.submit(2, 2, |items| c.call(items)).await });
    until(|| calls.batches().len() == 2).await;
    calls.gate.add_permits(2);
    assert_eq!(a.await.unwrap(), Ok(10));
    assert_eq!(other.await.unwrap(), Ok(20));
}

#[tokio::test]
async fn a_leader_dropped_mid_call_hands_the_lane_on_and_its_followers_are_told_lost() {
    let batcher = Arc::new(Batcher::<&str, u32, u32>::new(32));
    let calls = Calls::new();
    let (b, c) = (batcher.clone(), calls.clone());
    let leader = tokio::spawn(async move { b.submit("lane", 0, |items| c.call(items)).await });
    until(|| calls.batches().len() == 1).await;
    let (b, c) = (batcher.clone(), calls.clone());
    let second = tokio::spawn(async move { b.submit("lane", 1, |items| c.call(items)).await });
    until(|| batcher.waiting() == 1).await;
    // The second leads the next call; a third waits behind it.
    calls.gate.add_permits(1);
    assert_eq!(leader.await.unwrap(), Ok(0));
    until(|| calls.batches().len() == 2).await;
    let (b, c) = (batcher.clone(), calls.clone());
    let third = tokio::spawn(async move { b.submit("lane", 2, |items| c.call(items)).await });
    until(|| batcher.waiting() == 1).await;
    second.abort();
    // The lane goes on: the third leads a call of its own.
    until(|| calls.batches().len() == 3).await;
    assert_eq!(calls.batches()[2], vec![2]);
    calls.gate.add_permits(1);
    assert_eq!(third.await.unwrap(), Ok(20));
}

#[tokio::test]
async fn a_follower_of_a_dropped_leader_is_told_lost_and_one_gone_before_its_call_is_left_out() {
    let batcher = Arc::new(Batcher::<&str, u32, u32>::new(32));
    let calls = Calls::new();
    let (b, c) = (batcher.clone(), calls.clone());
    let first = tokio::spawn(async move { b.submit("lane", 0, |items| c.call(items)).await });
    until(|| calls.batches().len() == 1).await;
    let spawn = |i: u32| {
        let (b, c) = (batcher.clone(), calls.clone());
        tokio::spawn(async move { b.submit("lane", i, |items| c.call(items)).await })
    };
    let (leader, gone, follower) = (spawn(1), spawn(2), spawn(3));
    until(|| batcher.waiting() == 3).await;
    gone.abort();
    let _ = gone.await;
    calls.gate.add_permits(1);
    assert_eq!(first.await.unwrap(), Ok(0));
    until(|| calls.batches().len() == 2).await;
    assert_eq!(
        calls.batches()[1],
        vec![1, 3],
        "the asker gone before its call is left out"
    );
    leader.abort();
    assert_eq!(follower.await.unwrap(), Err(Lost));
}

#[tokio::test]
async fn held_items_go_in_one_batch_when_released() {
    let batcher = Arc::new(Batcher::<&str, u32, u32>::new(32));
    let calls = Calls::new();
    calls.gate.add_permits(10);
    batcher.hold();
    let tasks: Vec<_> = (0..4u32)
        .map(|i| {
            let (b, c) = (batcher.clone(), calls.clone());
            tokio::spawn(async move { b.submit("lane", i, |items| c.call(items)).await })
        })
        .collect();
    until(|| batcher.waiting() == 4).await;
    assert!(calls.batches().is_empty());
    batcher.release();
    for t in tasks {
        t.await.unwrap().unwrap();
    }
    assert_eq!(calls.batches(), vec![vec![0, 1, 2, 3]]);
}

#[tokio::test]
async fn concurrent_askers_share_one_flight_and_a_fresher_need_asks_again() {
    let flights = Arc::new(SingleFlight::<&str, u32>::default());
    let asked = Arc::new(AtomicUsize::new(0));
    let gate = Arc::new(Semaphore::new(0));
    let ask = |flights: Arc<SingleFlight<&'static str, u32>>, fresh_from: Instant| {
        let (asked, gate) = (asked.clone(), gate.clone());
        tokio::spawn(async move {
            flights
                .get("sold out?", fresh_from, || async move {
                    let n = asked.fetch_add(1, Ordering::SeqCst) as u32;
                    gate.acquire().await.unwrap().forget();
                    n
                })
                .await
        })
    };
    let before = Instant::now();
    let first = ask(flights.clone(), before);
    until(|| asked.load(Ordering::SeqCst) == 1).await;
    let joiners: Vec<_> = (0..5).map(|_| ask(flights.clone(), before)).collect();
    for _ in 0..100 {
        tokio::task::yield_now().await;
    }
    assert_eq!(
        asked.load(Ordering::SeqCst),
        1,
        "the joiners share the flight out"
    );
    // One that learned something after the flight left asks again; later askers join it.
    let fresher = ask(flights.clone(), Instant::now());
    until(|| asked.load(Ordering::SeqCst) == 2).await;
    gate.add_permits(2);
    assert_eq!(first.await.unwrap(), 0);
    assert_eq!(fresher.await.unwrap(), 1);
    for j in joiners {
        // Moved to the fresher flight: its answer serves them too.
        assert_eq!(j.await.unwrap(), 1);
    }
    assert!(flights.flights.lock().is_empty());
}

#[tokio::test(start_paused = true)]
async fn with_a_linger_the_first_item_waits_for_company() {
    let batcher = Arc::new(Batcher::<&str, u32, u32>::new(3).with_linger(Duration::from_millis(2)));
    let calls = Calls::new();
    calls.gate.add_permits(10);
    let mut tasks = Vec::new();
    for i in 0..4u32 {
        let (b, c) = (batcher.clone(), calls.clone());
        tasks.push(tokio::spawn(async move {
            b.submit("lane", i, |items| c.call(items)).await
        }));
        // Each arrives in order, within the linger: nothing left yet.
        until(|| batcher.waiting() == i as usize).await;
        assert!(calls.batches().is_empty());
    }
    // The linger passes: the first call carries three (the bound), the fourth goes next.
    tokio::time::advance(Duration::from_millis(2)).await;
    until(|| calls.batches().len() == 2).await;
    assert_eq!(calls.batches(), vec![vec![0, 1, 2], vec![3]]);
    for (i, t) in tasks.into_iter().enumerate() {
        assert_eq!(t.await.unwrap(), Ok(i as u32 * 10));
    }
}

#[tokio::test(start_paused = true)]
async fn a_leader_dropped_while_it_lingers_hands_the_lane_on() {
    let batcher = Arc::new(Batcher::<&str, u32, u32>::new(4).with_linger(Duration::from_millis(2)));
    let calls = Calls::new();
    calls.gate.add_permits(10);
    let first = {
        let (b, c) = (batcher.clone(), calls.clone());
        tokio::spawn(async move { b.submit("lane", 0, |items| c.call(items)).await })
    };
    let second = {
        let (b, c) = (batcher.clone(), calls.clone());
        tokio::spawn(async move { b.submit("lane", 1, |items| c.call(items)).await })
    };
    until(|| batcher.waiting() == 1).await;
    first.abort();
    assert_eq!(second.await.unwrap(), Ok(10));
    assert_eq!(calls.batches(), vec![vec![1]]);
}
