//! The settings every generated-sequence test runs with: `PROPTEST_CASES` sets how many
//! sequences (else the test's CI-sized default), `PROPTEST_RNG_SEED` which ones (proptest reads
//! it), and failures are kept beside the test in `proptest-regressions/`.

/// A proptest configuration of `default_cases` sequences (unless `PROPTEST_CASES` says
/// otherwise), shrinking a failure for at most `max_shrink_iters` steps.
pub fn sequences(default_cases: u32, max_shrink_iters: u32) -> proptest::test_runner::Config {
    proptest::test_runner::Config {
        cases: std::env::var("PROPTEST_CASES")
            .ok()
            .and_then(|c| c.parse().ok())
            .unwrap_or(default_cases),
        max_shrink_iters,
        failure_persistence: Some(Box::new(
            proptest::test_runner::FileFailurePersistence::WithSource("proptest-regressions"),
        )),
        ..proptest::test_runner::Config::default()
    }
}
