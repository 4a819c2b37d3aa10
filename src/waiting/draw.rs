//! The fair start: tickets issued before the sale's start (the pre-queue) get their places by a
//! random draw at the start, so arriving earlier or scripting faster gives no advantage; tickets
//! issued after it keep their number as their place (first come, first served).
//!
//! The draw is a keyed permutation of 1..=drawn: a four-round Feistel network over the smallest
//! power-of-four domain that holds them, keyed by the seed Redis recorded at the start, walked
//! until it lands inside the range (cycle walking). It needs no list of tickets (O(1) per
//! ticket, any gateway computes the same place), and anyone holding the seed can check the draw
//! afterwards: `place(n) = draw(n, drawn, seed)`.
//!
//! **The seed** is 32 random bytes chosen when the queue is set up (before or at `opens_at`) and
//! written to Redis with its commitment, `hex(sha256(seed))`, in the same step; with
//! `queue.draw: true` the commitment is published from `opens_at` and the seed (hex of the 32
//! bytes) from `starts_at`, once the pre-queue is closed. The seed's bytes are the HMAC key.
//! Each round `i` (0..4) of the Feistel network: `F(r) = first 8 bytes, big-endian, of
//! HMAC-SHA256(key = seed, message = [i] ++ r as 8 bytes big-endian)`, masked to the half width.
//! A queue drawn by an older flashgate recorded a 64-bit decimal seed: its key is those 8 bytes
//! big-endian, which HMAC pads with zeros, the same as the 32 bytes below (8 then 24 zeros).

use hmac::{KeyInit, Mac};
use sha2::Digest;

/// The draw's seed: the HMAC key of the Feistel rounds.
pub type Seed = [u8; 32];

/// A new random seed (two v4 UUIDs: 244 random bits).
pub fn random_seed() -> Seed {
    let mut seed = [0u8; 32];
    seed[..16].copy_from_slice(uuid::Uuid::new_v4().as_bytes());
    seed[16..].copy_from_slice(uuid::Uuid::new_v4().as_bytes());
    seed
}

/// The seed as Redis records it (and as it is published): 64 hex digits.
pub fn seed_hex(seed: &Seed) -> String {
    super::challenge::hex(seed)
}

/// The commitment to a seed: `hex(sha256(seed's 32 bytes))`.
pub fn commitment(seed: &Seed) -> String {
    super::challenge::hex(&sha2::Sha256::digest(seed))
}

/// A recorded seed: 64 hex digits, or an older flashgate's decimal 64-bit number (its 8 bytes
/// big-endian, then zeros: the same HMAC key).
pub fn parse_seed(raw: &str) -> Option<Seed> {
    if raw.len() == 64 {
        let bytes = super::challenge::decode_hex(raw)?;
        return bytes.try_into().ok();
    }
    raw.parse::<u64>().ok().map(legacy_seed)
}

/// An older flashgate's 64-bit seed as key bytes.
pub fn legacy_seed(seed: u64) -> Seed {
    let mut key = [0u8; 32];
    key[..8].copy_from_slice(&seed.to_be_bytes());
    key
}

/// Rounds of the Feistel network.
const ROUNDS: u8 = 4;

/// The place of ticket `number` (1-based): drawn among the first `drawn` tickets, else its
/// number.
pub fn place(number: u64, drawn: Option<u64>, seed: &Seed) -> u64 {
    match drawn {
        Some(drawn) if number >= 1 && number <= drawn => permute(number - 1, drawn, seed) + 1,
        _ => number,
    }
}

/// A bijection of `0..n` keyed by `seed`.
fn permute(x: u64, n: u64, seed: &Seed) -> u64 {
    if n <= 1 {
        return x;
    }
    // Half-width in bits: the domain is 2^(2*half) >= n.
    let bits = 64 - (n - 1).leading_zeros();
    let half = bits.div_ceil(2).max(1);
    let mask = (1u64 << half) - 1;
    let mut v = x;
    loop {
        let (mut l, mut r) = (v >> half, v & mask);
        for round in 0..ROUNDS {
            let f = round_function(seed, round, r) & mask;
            (l, r) = (r, l ^ f);
        }
        v = (l << half) | r;
        if v < n {
            return v;
        }
    }
}

fn round_function(seed: &Seed, round: u8, value: u64) -> u64 {
    let mut mac =
        hmac::Hmac::<sha2::Sha256>::new_from_slice(seed).expect("HMAC takes a key of any length");
    mac.update(&[round]);
    mac.update(&value.to_be_bytes());
    let out = mac.finalize().into_bytes();
    u64::from_be_bytes(out[..8].try_into().expect("32 bytes"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_draw_is_a_permutation_of_the_pre_queue() {
        for n in [1u64, 2, 3, 7, 64, 100, 1000, 4097] {
            let mut seen = vec![false; n as usize];
            for k in 1..=n {
                let p = place(k, Some(n), &legacy_seed(42));
                assert!((1..=n).contains(&p), "{k} -> {p} of {n}");
                assert!(!seen[(p - 1) as usize], "{p} drawn twice");
                seen[(p - 1) as usize] = true;
            }
        }
    }

    #[test]
    fn later_tickets_keep_their_number_and_the_seed_decides_the_draw() {
        assert_eq!(place(101, Some(100), &legacy_seed(7)), 101);
        assert_eq!(place(5, None, &legacy_seed(7)), 5);
        let a: Vec<u64> = (1..=50)
            .map(|k| place(k, Some(50), &legacy_seed(1)))
            .collect();
        let b: Vec<u64> = (1..=50)
            .map(|k| place(k, Some(50), &legacy_seed(2)))
            .collect();
        assert_ne!(a, b);
        assert_eq!(
            a,
            (1..=50)
                .map(|k| place(k, Some(50), &legacy_seed(1)))
                .collect::<Vec<_>>()
        );
    }

    /// An older flashgate's seed (8 bytes as the HMAC key) draws as its padded 32 bytes do,
    /// and the hex form round-trips; the commitment is SHA-256 of the 32 bytes.
    #[test]
    fn seeds_parse_old_and_new_and_commit() {
        assert_eq!(parse_seed("77"), Some(legacy_seed(77)));
        let seed = random_seed();
        assert_eq!(parse_seed(&seed_hex(&seed)), Some(seed));
        assert_eq!(
            commitment(&[0u8; 32]),
            "66687aadf862bd776c8fc18b8e9f8e20089714856ee233b3902a591d0d5f2925"
        );
        let old = |key: &[u8]| {
            let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(key).unwrap();
            mac.update(&[0, 0, 0, 0, 0, 0, 0, 0, 5]);
            mac.finalize().into_bytes()
        };
        assert_eq!(old(&77u64.to_be_bytes()), old(&legacy_seed(77)));
    }

    /// Spearman's rank correlation between arrival and place, for 10,000 pre-queue tickets
    /// under several seeds: about 0 (|rho| < 0.03: far below what arrival order would give).
    #[test]
    fn places_are_uncorrelated_with_arrival_order() {
        let n = 10_000u64;
        for seed in [1u64, 99, 0xdead_beef] {
            let mean = (n as f64 + 1.0) / 2.0;
            let (mut cov, mut var) = (0.0, 0.0);
            for k in 1..=n {
                let p = place(k, Some(n), &legacy_seed(seed)) as f64;
                cov += (k as f64 - mean) * (p - mean);
                var += (k as f64 - mean).powi(2);
            }
            let rho = cov / var;
            assert!(rho.abs() < 0.03, "seed {seed}: rho {rho}");
        }
    }
}
