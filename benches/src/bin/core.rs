//! Benchmarks of the execute_code core (filled in below).
fn main() {}
