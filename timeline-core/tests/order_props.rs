//! Laws of the canonical order (TL-04, TL-05): a total order, so sorting never panics,
//! and the sorted result does not depend on arrival order.
#![allow(clippy::unwrap_used)]

use std::cmp::Ordering;

use fixtures::strategies::{block_key, order_key};
use proptest::prelude::*;

proptest! {
    #![proptest_config(ProptestConfig::with_cases(fixtures::proptest_cases()))]

    // TL-04
    #[test]
    fn order_is_reflexive(a in order_key()) {
        prop_assert_eq!(a.cmp(&a), Ordering::Equal);
    }

    // TL-04
    #[test]
    fn order_is_antisymmetric(a in order_key(), b in order_key()) {
        prop_assert_eq!(a.cmp(&b), b.cmp(&a).reverse());
        if a.cmp(&b) == Ordering::Equal {
            prop_assert_eq!(&a, &b);
        }
    }

    // TL-04
    #[test]
    fn order_is_transitive(a in order_key(), b in order_key(), c in order_key()) {
        if a <= b && b <= c {
            prop_assert!(a <= c);
        }
        if a >= b && b >= c {
            prop_assert!(a >= c);
        }
        if a == b && b == c {
            prop_assert_eq!(a.cmp(&c), Ordering::Equal);
        }
    }

    // TL-04: sorting never panics and ignores arrival order.
    #[test]
    fn sorting_ignores_arrival_order(mut keys in prop::collection::vec(order_key(), 0..40), seed in any::<u64>()) {
        let mut sorted = keys.clone();
        sorted.sort();
        // A deterministic shuffle drawn from the proptest seed.
        let mut s = seed;
        for i in (1..keys.len()).rev() {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            keys.swap(i, (s >> 33) as usize % (i + 1));
        }
        keys.sort();
        prop_assert_eq!(keys, sorted);
    }

    // TL-01: key order equals encoded-string order.
    #[test]
    fn key_order_matches_the_encoding(a in block_key(), b in block_key()) {
        prop_assert_eq!(a.cmp(&b), a.encoded().cmp(&b.encoded()));
        prop_assert_eq!(timeline_core::key::BlockKey::decode(&a.encoded()).unwrap(), a);
    }
}
