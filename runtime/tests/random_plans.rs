//! Random small plans (split blocks, relays through scratch, shuffled order)
//! through the CPU backend: correct plans verify byte for byte, and a plan with
//! one transfer reading from the wrong offset fails with the first bad range.

use std::time::Duration;

mod common;

use proptest::prelude::*;

use common::{random_plan, shift_one_read, traffic};
use switchyard_runtime::{execute, BackendKind, RunOptions};

fn opts() -> RunOptions {
    RunOptions {
        threads: 3,
        timeout: Duration::from_secs(10),
        ..RunOptions::default()
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn random_correct_plans_verify((m, gpn) in traffic(), seed in any::<u64>()) {
        let plan = random_plan(&m, gpn, seed);
        switchyard_compiler::verify(&plan, &m).unwrap();
        let r = execute(&plan, &m, BackendKind::Cpu, &opts()).unwrap();
        prop_assert!(r.verified, "{:?}", r.first_bad);
        prop_assert_eq!(r.bad_bytes, 0);
        prop_assert_eq!(r.link_bytes.total(), plan.transfers.iter().map(|t| t.bytes).sum::<u64>());
    }

    #[test]
    fn one_shifted_read_is_caught((m, gpn) in traffic(), seed in any::<u64>(), pick in any::<u64>()) {
        let mut plan = random_plan(&m, gpn, seed);
        prop_assume!(shift_one_read(&mut plan, &m, pick));
        let r = execute(&plan, &m, BackendKind::Cpu, &opts()).unwrap();
        prop_assert!(!r.verified);
        prop_assert!(r.bad_bytes > 0);
        let first = r.first_bad.unwrap();
        prop_assert!(first.starts_with("output of rank "), "{}", first);
    }
}
