//! A persistent ordered map: a weight-balanced binary tree (Adams' trees, with the
//! parameters 3 and 2 that Haskell's `Data.Map` uses) whose nodes are shared through
//! [`Arc`].
//!
//! Cloning a map is O(1) and never copies an entry; an insert or a removal copies only
//! the O(log n) nodes on its path, and every other node stays shared with the versions
//! that hold it. So a store can keep one version, hand the same version to a caller as a
//! snapshot, and build the next version in O(k log n) for k changed entries whatever the
//! caller keeps. A node owned by one version only is moved, not copied.
//!
//! Invariants, checked after every step by the property tests below: keys strictly
//! increase in order; every node's `size` is the number of entries under it; each
//! subtree is balanced (`size(l) + size(r) <= 1`, or neither side holds more than three
//! times the other), so the depth stays logarithmic.

use std::cmp::Ordering;
use std::fmt;
use std::sync::Arc;

/// Neither subtree holds more than `DELTA` times the other.
const DELTA: usize = 3;
/// Chooses a single or a double rotation.
const RATIO: usize = 2;

type Link<K, V> = Option<Arc<Node<K, V>>>;

struct Node<K, V> {
    entry: Arc<(K, V)>,
    size: usize,
    left: Link<K, V>,
    right: Link<K, V>,
}

impl<K, V> Clone for Node<K, V> {
    fn clone(&self) -> Self {
        Node {
            entry: Arc::clone(&self.entry),
            size: self.size,
            left: self.left.clone(),
            right: self.right.clone(),
        }
    }
}

fn size<K, V>(link: &Link<K, V>) -> usize {
    link.as_ref().map_or(0, |n| n.size)
}

/// The node's parts: moved out when this version owns it, else a shallow copy (three
/// reference counts).
fn open<K, V>(node: Arc<Node<K, V>>) -> Node<K, V> {
    Arc::try_unwrap(node).unwrap_or_else(|shared| (*shared).clone())
}

fn node<K, V>(entry: Arc<(K, V)>, left: Link<K, V>, right: Link<K, V>) -> Link<K, V> {
    Some(Arc::new(Node {
        size: size(&left) + size(&right) + 1,
        entry,
        left,
        right,
    }))
}

/// Joins `left`, `entry` and `right`, which were balanced before one insert into or one
/// removal from either side.
fn balance<K, V>(entry: Arc<(K, V)>, left: Link<K, V>, right: Link<K, V>) -> Link<K, V> {
    let (sl, sr) = (size(&left), size(&right));
    if sl + sr <= 1 {
        node(entry, left, right)
    } else if sr > DELTA * sl {
        rotate_left(entry, left, right)
    } else if sl > DELTA * sr {
        rotate_right(entry, left, right)
    } else {
        node(entry, left, right)
    }
}

fn rotate_left<K, V>(entry: Arc<(K, V)>, left: Link<K, V>, right: Link<K, V>) -> Link<K, V> {
    let Some(r) = right else {
        return node(entry, left, None);
    };
    let r = open(r);
    if size(&r.left) < RATIO * size(&r.right) {
        node(r.entry, node(entry, left, r.left), r.right)
    } else {
        // The right side's left child is not empty here: its size is at least twice
        // the right child's, and the right side holds at least two entries.
        let Some(rl) = r.left else {
            return node(r.entry, node(entry, left, None), r.right);
        };
        let rl = open(rl);
        node(
            rl.entry,
            node(entry, left, rl.left),
            node(r.entry, rl.right, r.right),
        )
    }
}

fn rotate_right<K, V>(entry: Arc<(K, V)>, left: Link<K, V>, right: Link<K, V>) -> Link<K, V> {
    let Some(l) = left else {
        return node(entry, None, right);
    };
    let l = open(l);
    if size(&l.right) < RATIO * size(&l.left) {
        node(l.entry, l.left, node(entry, l.right, right))
    } else {
        let Some(lr) = l.right else {
            return node(l.entry, l.left, node(entry, None, right));
        };
        let lr = open(lr);
        node(
            lr.entry,
            node(l.entry, l.left, lr.left),
            node(entry, lr.right, right),
        )
    }
}

fn insert<K: Ord, V>(link: Link<K, V>, entry: Arc<(K, V)>) -> Link<K, V> {
    let Some(n) = link else {
        return node(entry, None, None);
    };
    let n = open(n);
    match entry.0.cmp(&n.entry.0) {
        Ordering::Less => balance(n.entry, insert(n.left, entry), n.right),
        Ordering::Greater => balance(n.entry, n.left, insert(n.right, entry)),
        Ordering::Equal => node(entry, n.left, n.right),
    }
}

/// Removes `key`, which the tree holds.
fn remove<K: Ord, V>(link: Link<K, V>, key: &K) -> Link<K, V> {
    let n = open(link?);
    match key.cmp(&n.entry.0) {
        Ordering::Less => balance(n.entry, remove(n.left, key), n.right),
        Ordering::Greater => balance(n.entry, n.left, remove(n.right, key)),
        Ordering::Equal => glue(n.left, n.right),
    }
}

/// Joins two balanced trees whose sizes were balanced, every key of `left` below every
/// key of `right`.
fn glue<K, V>(left: Link<K, V>, right: Link<K, V>) -> Link<K, V> {
    match (left, right) {
        (None, right) => right,
        (left, None) => left,
        (Some(l), Some(r)) => {
            if l.size > r.size {
                let (max, l) = remove_max(l);
                balance(max, l, Some(r))
            } else {
                let (min, r) = remove_min(r);
                balance(min, Some(l), r)
            }
        }
    }
}

fn remove_min<K, V>(n: Arc<Node<K, V>>) -> (Arc<(K, V)>, Link<K, V>) {
    let n = open(n);
    match n.left {
        None => (n.entry, n.right),
        Some(l) => {
            let (min, l) = remove_min(l);
            (min, balance(n.entry, l, n.right))
        }
    }
}

fn remove_max<K, V>(n: Arc<Node<K, V>>) -> (Arc<(K, V)>, Link<K, V>) {
    let n = open(n);
    match n.right {
        None => (n.entry, n.left),
        Some(r) => {
            let (max, r) = remove_max(r);
            (max, balance(n.entry, n.left, r))
        }
    }
}

/// A balanced tree of the next `count` entries of `entries`, in order.
fn build<K, V>(entries: &mut impl Iterator<Item = Arc<(K, V)>>, count: usize) -> Link<K, V> {
    if count == 0 {
        return None;
    }
    let below = count / 2;
    let left = build(entries, below);
    let Some(entry) = entries.next() else {
        return left;
    };
    let right = build(entries, count - below - 1);
    node(entry, left, right)
}

/// A persistent ordered map. See the module docs.
pub(crate) struct PMap<K, V> {
    root: Link<K, V>,
}

impl<K, V> Clone for PMap<K, V> {
    fn clone(&self) -> Self {
        PMap {
            root: self.root.clone(),
        }
    }
}

impl<K, V> Default for PMap<K, V> {
    fn default() -> Self {
        PMap { root: None }
    }
}

impl<K: Ord, V> PMap<K, V> {
    /// The map of `entries`, whose keys must strictly increase (callers sort and
    /// deduplicate first); O(n).
    pub(crate) fn from_sorted(entries: Vec<(K, V)>) -> Self {
        let count = entries.len();
        let mut entries = entries.into_iter().map(Arc::new);
        PMap {
            root: build(&mut entries, count),
        }
    }

    /// The number of entries.
    pub(crate) fn len(&self) -> usize {
        size(&self.root)
    }

    /// The value of `key`.
    pub(crate) fn get(&self, key: &K) -> Option<&V> {
        self.get_entry(key).map(|e| &e.1)
    }

    /// The shared entry of `key`.
    pub(crate) fn get_entry(&self, key: &K) -> Option<&Arc<(K, V)>> {
        let mut link = &self.root;
        while let Some(n) = link {
            match key.cmp(&n.entry.0) {
                Ordering::Less => link = &n.left,
                Ordering::Greater => link = &n.right,
                Ordering::Equal => return Some(&n.entry),
            }
        }
        None
    }

    /// Stores `entry`, replacing the entry of an equal key.
    pub(crate) fn insert_entry(&mut self, entry: Arc<(K, V)>) {
        self.root = insert(self.root.take(), entry);
    }

    /// Stores `value` under `key`, replacing the entry of an equal key.
    pub(crate) fn insert(&mut self, key: K, value: V) {
        self.insert_entry(Arc::new((key, value)));
    }

    /// Removes `key` and returns its entry; `None` (and nothing changes) when absent.
    pub(crate) fn remove(&mut self, key: &K) -> Option<Arc<(K, V)>> {
        let entry = Arc::clone(self.get_entry(key)?);
        self.root = remove(self.root.take(), key);
        Some(entry)
    }

    /// Every entry in key order.
    pub(crate) fn iter(&self) -> Iter<'_, K, V> {
        self.iter_from(|_| true)
    }

    /// The entries from the first one whose key satisfies `at_or_after` on, in key
    /// order. `at_or_after` must be monotone: false for a (possibly empty) run of the
    /// smallest keys and true for every key after them.
    pub(crate) fn iter_from(&self, at_or_after: impl Fn(&K) -> bool) -> Iter<'_, K, V> {
        let mut stack = Vec::new();
        let mut link = &self.root;
        while let Some(n) = link {
            if at_or_after(&n.entry.0) {
                stack.push(&**n);
                link = &n.left;
            } else {
                link = &n.right;
            }
        }
        Iter { stack }
    }
}

impl<K: PartialEq, V: PartialEq> PartialEq for PMap<K, V> {
    fn eq(&self, other: &Self) -> bool {
        // Equal versions often share their root.
        match (&self.root, &other.root) {
            (Some(a), Some(b)) if Arc::ptr_eq(a, b) => return true,
            _ => {}
        }
        size(&self.root) == size(&other.root)
            && Iter::over(&self.root)
                .zip(Iter::over(&other.root))
                .all(|(a, b)| a.0 == b.0 && a.1 == b.1)
    }
}

impl<K: fmt::Debug, V: fmt::Debug> fmt::Debug for PMap<K, V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map()
            .entries(Iter::over(&self.root).map(|e| (&e.0, &e.1)))
            .finish()
    }
}

/// In-order iteration over a [`PMap`].
pub(crate) struct Iter<'a, K, V> {
    stack: Vec<&'a Node<K, V>>,
}

impl<'a, K, V> Iter<'a, K, V> {
    fn over(root: &'a Link<K, V>) -> Self {
        let mut it = Iter { stack: Vec::new() };
        it.push_left(root);
        it
    }

    fn push_left(&mut self, mut link: &'a Link<K, V>) {
        while let Some(n) = link {
            self.stack.push(n);
            link = &n.left;
        }
    }
}

impl<'a, K, V> Iterator for Iter<'a, K, V> {
    type Item = &'a Arc<(K, V)>;

    fn next(&mut self) -> Option<Self::Item> {
        let n = self.stack.pop()?;
        self.push_left(&n.right);
        Some(&n.entry)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use proptest::prelude::*;

    use super::*;

    /// Checks the invariants of the module docs; returns the subtree's size.
    fn check<K: Ord, V>(link: &Link<K, V>, low: Option<&K>, high: Option<&K>) -> usize {
        let Some(n) = link else { return 0 };
        let k = &n.entry.0;
        assert!(low.is_none_or(|l| l < k), "keys out of order");
        assert!(high.is_none_or(|h| k < h), "keys out of order");
        let sl = check(&n.left, low, Some(k));
        let sr = check(&n.right, Some(k), high);
        assert_eq!(n.size, sl + sr + 1, "size");
        assert!(
            sl + sr <= 1 || (sl <= DELTA * sr && sr <= DELTA * sl),
            "unbalanced: {sl} / {sr}"
        );
        n.size
    }

    #[derive(Clone, Debug)]
    enum Op {
        Insert(u16, u32),
        Remove(u16),
    }

    fn ops() -> impl Strategy<Value = Vec<Op>> {
        prop::collection::vec(
            prop_oneof![
                (0u16..300, any::<u32>()).prop_map(|(k, v)| Op::Insert(k, v)),
                (0u16..300).prop_map(Op::Remove),
            ],
            0..400,
        )
    }

    proptest! {
        // The map equals a `BTreeMap` driven by the same operations, keeps its
        // invariants after every step, and an older version never changes.
        #[test]
        fn a_pmap_is_a_persistent_btreemap(ops in ops(), start in prop::collection::btree_map(0u16..300, any::<u32>(), 0..100)) {
            let mut map = PMap::from_sorted(start.clone().into_iter().collect());
            let mut model = start;
            check(&map.root, None, None);
            let mut versions = vec![(map.clone(), model.clone())];
            for op in ops {
                match op {
                    Op::Insert(k, v) => {
                        map.insert(k, v);
                        model.insert(k, v);
                    }
                    Op::Remove(k) => {
                        let got = map.remove(&k).map(|e| e.1);
                        prop_assert_eq!(got, model.remove(&k));
                    }
                }
                check(&map.root, None, None);
                prop_assert_eq!(map.len(), model.len());
                versions.push((map.clone(), model.clone()));
            }
            for (version, model) in &versions {
                let got: Vec<(u16, u32)> = version.iter().map(|e| (e.0, e.1)).collect();
                let want: Vec<(u16, u32)> = model.iter().map(|(k, v)| (*k, *v)).collect();
                prop_assert_eq!(got, want);
            }
        }

        // `iter_from` starts at the first key the predicate accepts.
        #[test]
        fn iter_from_starts_at_the_lower_bound(keys in prop::collection::btree_set(0u16..500, 0..200), bound in 0u16..520) {
            let map = PMap::from_sorted(keys.iter().map(|k| (*k, ())).collect());
            let got: Vec<u16> = map.iter_from(|k| *k >= bound).map(|e| e.0).collect();
            let want: Vec<u16> = keys.range(bound..).copied().collect();
            prop_assert_eq!(got, want);
        }
    }

    #[test]
    fn a_clone_shares_and_get_finds() {
        let mut a: PMap<u32, &str> = PMap::default();
        for (k, v) in [(2, "b"), (1, "a"), (3, "c")] {
            a.insert(k, v);
        }
        let b = a.clone();
        a.remove(&2);
        assert_eq!(b.get(&2), Some(&"b"));
        assert_eq!(a.get(&2), None);
        assert_eq!(a.len(), 2);
        assert_eq!(b.len(), 3);
        assert!(a != b);
        let model: BTreeMap<u32, &str> = BTreeMap::from([(1, "a"), (3, "c")]);
        assert!(a.iter().map(|e| (e.0, e.1)).eq(model.into_iter()));
    }
}
