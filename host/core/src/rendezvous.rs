//! Rendezvous hashing (highest random weight): of a set of nodes, a key
//! belongs to the node that scores highest for it. A node that leaves
//! takes only its own keys with it (each goes to the node that scored
//! second for it); a node that joins takes only the keys it now scores
//! highest for. The `shard` director (a key's backend) and the cluster's
//! shard (a key's owner node) both choose with [`owner`].
//!
//! The function is fixed here, so that every node and every release of
//! Inlay maps a key to the same owner:
//!
//! - a key and a node name are each hashed with [FNV-1a] 64 over their
//!   UTF-8 bytes (offset basis `0xcbf29ce484222325`, prime
//!   `0x100000001b3`): [`hash`];
//! - the score of a node for a key is splitmix64's output function
//!   (Steele, Lea and Flood, 2014) over
//!   `key ^ node.rotate_left(32) ^ 0x9e3779b97f4a7c15`: [`score`];
//! - the highest score wins; a tie (two names with one FNV hash) goes to
//!   the greater name.
//!
//! Why these: FNV-1a has no seed and published constants, and is a few
//! lines; on its own its bits mix poorly, which the finaliser (a bijection
//! of 64 bits in which every input bit moves every output bit) makes
//! good, so the keys spread evenly (tested). std's `DefaultHasher`, used
//! before by the director, promises no algorithm across Rust releases: an
//! upgrade could have moved every key. SipHash-1-3 with zero keys would be
//! as stable, but needs a crate and buys resistance to hash flooding that
//! a choice among a few nodes does not need (with any unkeyed function a
//! client can search for keys one node owns). The cluster's shard has used
//! this function since it was written, so its mapping is unchanged.
//!
//! [FNV-1a]: https://datatracker.ietf.org/doc/html/draft-eastlake-fnv

/// FNV-1a 64 of `text`'s bytes: the hash of a key or of a node name.
pub fn hash(text: &str) -> u64 {
    text.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// The score of the node whose name hashes to `node` for the key that
/// hashes to `key` (both [`hash`]): splitmix64's finaliser over both, so
/// that every bit of each moves the score.
pub fn score(key: u64, node: u64) -> u64 {
    let mut z = key ^ node.rotate_left(32) ^ 0x9e37_79b9_7f4a_7c15;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Of `nodes` (each its name, the [`hash`] of its name, computed once, and
/// a value), the value of the one with the highest [`score`] for `key`
/// (the [`hash`] of the key); ties go to the greater name. `None` when
/// there is no node. The order of `nodes` does not matter.
pub fn owner<'a, T>(key: u64, nodes: impl IntoIterator<Item = (&'a str, u64, T)>) -> Option<T> {
    nodes
        .into_iter()
        .max_by(|a, b| (score(key, a.1), a.0).cmp(&(score(key, b.1), b.0)))
        .map(|(_, _, v)| v)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn owner_of(key: &str, nodes: &[String]) -> String {
        owner(hash(key), nodes.iter().map(|n| (n.as_str(), hash(n), n)))
            .unwrap()
            .clone()
    }

    #[test]
    fn the_hash_is_fnv_1a_64() {
        // The published test vectors of FNV-1a 64.
        assert_eq!(hash(""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(hash("a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(hash("foobar"), 0x8594_4171_f739_67e8);
    }

    #[test]
    fn the_score_is_splitmix64s_output() {
        // splitmix64 seeded with 0: its first two outputs mix one and two
        // golden-ratio increments.
        const GOLDEN: u64 = 0x9e37_79b9_7f4a_7c15;
        assert_eq!(score(0, 0), 0xe220_a839_7b1d_cdaf);
        assert_eq!(
            score(GOLDEN.wrapping_mul(2) ^ GOLDEN, 0),
            0x6e78_9e6a_a1b9_65f4
        );
    }

    /// Fixed keys and node names: their scores and owner, pinned. A change
    /// here moves keys between the backends of every `shard` director and
    /// the nodes of every sharded cluster: it must not happen by accident.
    #[test]
    fn pinned_vectors() {
        let nodes: Vec<String> = ["edge-1", "edge-2", "edge-3"].map(String::from).to_vec();
        let cases: [(&str, [u64; 3], &str); 3] = [
            (
                "www.example.com/",
                [
                    0x9e1b_af58_721a_2361,
                    0x8cff_c2a4_6287_af17,
                    0x0916_fb8d_4edc_b071,
                ],
                "edge-1",
            ),
            (
                "www.example.com/about",
                [
                    0x33b1_5451_081e_b4be,
                    0xfaf2_efac_8849_8ae6,
                    0x9fbc_f90e_7a66_bb7e,
                ],
                "edge-2",
            ),
            (
                "shop.example.com/cart?id=42",
                [
                    0x7c1b_eed0_112f_bbce,
                    0x8e7a_7cab_af03_f721,
                    0xe83d_a57d_4ce5_059f,
                ],
                "edge-3",
            ),
        ];
        for (key, scores, expected) in cases {
            let got: Vec<u64> = nodes.iter().map(|n| score(hash(key), hash(n))).collect();
            assert_eq!(got, scores, "scores of {key}");
            assert_eq!(owner_of(key, &nodes), expected, "owner of {key}");
        }
    }

    #[test]
    fn keys_spread_evenly_and_a_node_that_leaves_or_joins_moves_only_its_own_keys() {
        let nodes: Vec<String> = (0..10).map(|i| format!("edge-{i}")).collect();
        let keys: Vec<String> = (0..20_000)
            .map(|i| format!("example.com/object/{i}"))
            .collect();
        let before: Vec<String> = keys.iter().map(|k| owner_of(k, &nodes)).collect();
        // Spread: every node owns its share within ±20 %.
        for n in &nodes {
            let owned = before.iter().filter(|o| *o == n).count();
            assert!((1600..=2400).contains(&owned), "{n} owns {owned} of 20000");
        }
        let gone = "edge-3";
        let fewer: Vec<String> = nodes.iter().filter(|n| *n != gone).cloned().collect();
        for (k, was) in keys.iter().zip(&before) {
            let now = owner_of(k, &fewer);
            if was == gone {
                assert_ne!(now, gone);
            } else {
                assert_eq!(&now, was, "{k} moved though its owner stayed");
            }
        }
        let mut more = nodes.clone();
        more.push("edge-new".into());
        let mut moved = 0;
        for (k, was) in keys.iter().zip(&before) {
            let now = owner_of(k, &more);
            if &now != was {
                assert_eq!(now, "edge-new", "{k} moved between old nodes");
                moved += 1;
            }
        }
        let lost = before.iter().filter(|o| *o == gone).count();
        // README's figure: `cargo test -p inlay-core rendezvous -- --nocapture`.
        eprintln!(
            "20000 keys over 10 nodes: {gone} leaving remaps its {lost}, a node joining takes {moved}"
        );
        // About 1/11 of the keys go to the new node.
        assert!(
            (1400..=2300).contains(&moved),
            "{moved} keys moved to the new node"
        );
    }

    #[test]
    fn the_owner_does_not_depend_on_the_order_nodes_are_listed_in() {
        let mut nodes: Vec<String> = (0..5).map(|i| format!("n{i}")).collect();
        let first: Vec<String> = (0..500).map(|i| owner_of(&i.to_string(), &nodes)).collect();
        nodes.reverse();
        let second: Vec<String> = (0..500).map(|i| owner_of(&i.to_string(), &nodes)).collect();
        assert_eq!(first, second);
    }

    #[test]
    fn a_tie_goes_to_the_greater_name_and_no_node_owns_nothing() {
        // Two names given one hash score alike: the greater name wins,
        // whichever comes first.
        let tied = [("a", 7, "a"), ("b", 7, "b")];
        assert_eq!(owner(1, tied), Some("b"));
        assert_eq!(owner(1, [tied[1], tied[0]]), Some("b"));
        assert_eq!(owner::<()>(1, []), None);
    }
}
