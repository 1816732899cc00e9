//! The test database of the root package's tests (`DTASK_TEST_PG_URL`, which `./dev test`
//! and CI set): a fresh schema per test.

/// A fresh schema of the test database for test `name` of the test crate `prefix`, or `None`
/// (and a loud line) without one.
pub fn pg_url(prefix: &str, name: &str) -> Option<String> {
    let Ok(base) = std::env::var("DTASK_TEST_PG_URL") else {
        eprintln!("SKIPPED {name}: DTASK_TEST_PG_URL is not set (./dev test sets it)");
        return None;
    };
    let sep = if base.contains('?') { '&' } else { '?' };
    Some(format!(
        "{base}{sep}schema={prefix}{}_{name}",
        std::process::id()
    ))
}
