//! Parsed ESI templates, kept by content: a page assembled from the cache is
//! parsed once, not on every request (Varnish parses ESI once, at fetch).
//!
//! Entries are found by a hash of the body and used only when the stored
//! body is byte for byte the one asked about, so two templates can never be
//! confused. The parsed nodes point into the body (`Bytes` slices), so an
//! entry costs little more than the body it keeps alive, and the regular
//! expressions of its `matches` tests once they are compiled.

use std::sync::Arc;

use bytes::Bytes;
use quick_cache::sync::Cache;
use quick_cache::{DefaultHashBuilder, Weighter};

use super::expr::Expr;
use super::parser::{EsiParser, Node};

/// Bytes of template bodies kept parsed (bodies plus a per-node estimate).
pub const TEMPLATE_CACHE_BYTES: u64 = 16 * 1024 * 1024;

/// A node's own weight: a few words, plus its attribute strings.
const NODE_WEIGHT: u64 = 128;

/// A `matches` pattern written in the template, compiled with its lazy DFA
/// cache: a few KB for ASCII patterns, up to several hundred for Unicode
/// classes (`\w`); this is a middle estimate.
const PATTERN_WEIGHT: u64 = 32 * 1024;

/// A template body with its parse.
struct Parsed {
    body: Bytes,
    nodes: Arc<[Node]>,
    /// The cache weight, counted once at parse.
    weight: u64,
}

/// What parsed nodes cost beyond the body bytes they point into.
fn nodes_weight(nodes: &[Node]) -> u64 {
    let block = |n: &Node| match n {
        Node::Choose(c) => {
            let whens = c.whens.iter().map(|w| {
                let patterns = w.test.as_ref().map_or(0, Expr::pattern_count);
                NODE_WEIGHT + nodes_weight(&w.body) + PATTERN_WEIGHT * patterns as u64
            });
            whens.sum::<u64>() + nodes_weight(&c.otherwise)
        }
        Node::Try(t) => nodes_weight(&t.attempt) + nodes_weight(&t.except),
        Node::Text(_) | Node::Include(_) | Node::Vars(_) => 0,
    };
    nodes.iter().map(|n| NODE_WEIGHT + block(n)).sum()
}

#[derive(Clone)]
struct ParsedWeighter;

impl Weighter<u64, Arc<Parsed>> for ParsedWeighter {
    fn weight(&self, _key: &u64, val: &Arc<Parsed>) -> u64 {
        val.weight
    }
}

/// Parsed templates by content (see the module docs).
pub struct ParsedTemplates {
    cache: Cache<u64, Arc<Parsed>, ParsedWeighter>,
    hasher: DefaultHashBuilder,
}

impl std::fmt::Debug for ParsedTemplates {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ParsedTemplates")
            .field("entries", &self.cache.len())
            .finish_non_exhaustive()
    }
}

impl Default for ParsedTemplates {
    fn default() -> Self {
        Self::new(TEMPLATE_CACHE_BYTES)
    }
}

impl ParsedTemplates {
    /// Keep up to `max_bytes` of templates (see [`TEMPLATE_CACHE_BYTES`]).
    pub fn new(max_bytes: u64) -> Self {
        // Templates are a few KiB: estimate 4 KiB each for the item count.
        let items = (max_bytes / 4096).max(16) as usize;
        ParsedTemplates {
            cache: Cache::with_weighter(items, max_bytes, ParsedWeighter),
            hasher: DefaultHashBuilder::default(),
        }
    }

    /// The parse of `body`, from an earlier call when it was the same bytes.
    pub fn nodes(&self, body: &Bytes) -> Arc<[Node]> {
        let key = self.hasher.hash_one(body.as_ref());
        if let Some(p) = self.cache.get(&key)
            && p.body == *body
        {
            return p.nodes.clone();
        }
        let mut parser = EsiParser::new();
        let mut nodes = parser.feed_bytes(body.clone());
        nodes.extend(parser.finish());
        let weight = body.len() as u64 + nodes_weight(&nodes) + 64;
        let nodes: Arc<[Node]> = nodes.into();
        // A colliding entry is replaced: the newest template wins.
        self.cache.insert(
            key,
            Arc::new(Parsed {
                body: body.clone(),
                nodes: nodes.clone(),
                weight,
            }),
        );
        nodes
    }

    /// How many templates are kept.
    pub fn len(&self) -> usize {
        self.cache.len()
    }

    /// Whether none is kept.
    pub fn is_empty(&self) -> bool {
        self.cache.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parse;

    #[test]
    fn a_template_is_parsed_once_and_gives_what_a_fresh_parse_gives() {
        let t = ParsedTemplates::default();
        let body =
            Bytes::from_static(b"a<esi:include src=\"/x\"/>b<esi:vars>$(HTTP_HOST)</esi:vars>");
        let first = t.nodes(&body);
        assert_eq!(&*first, parse(&body).as_slice());
        let again = t.nodes(&Bytes::copy_from_slice(&body));
        assert!(
            Arc::ptr_eq(&first, &again),
            "the second call reuses the parse"
        );
        assert_eq!(t.len(), 1);
        let other = Bytes::from_static(b"<esi:include src=\"/y\"/>");
        assert_eq!(&*t.nodes(&other), parse(&other).as_slice());
        assert_eq!(t.len(), 2);
    }

    #[test]
    fn compiled_patterns_count_in_the_weight() {
        let weigh = |page: &str| nodes_weight(&parse(page.as_bytes()));
        let plain = weigh("<esi:choose><esi:when test=\"$(A) has 'x'\">a</esi:when></esi:choose>");
        let one =
            weigh("<esi:choose><esi:when test=\"$(A) matches 'x'\">a</esi:when></esi:choose>");
        assert_eq!(one - plain, PATTERN_WEIGHT);
        // Blocks inside blocks count too.
        let nested = weigh(
            "<esi:try><esi:attempt><esi:choose><esi:when test=\"$(A) matches 'x' | $(B) matches_i 'y'\">\
             a</esi:when></esi:choose></esi:attempt></esi:try>",
        );
        assert!(nested >= 2 * PATTERN_WEIGHT, "{nested}");
    }

    #[test]
    fn the_budget_holds() {
        let t = ParsedTemplates::new(64 * 1024);
        for i in 0..200 {
            let body = Bytes::from(format!(
                "{i:04}<esi:include src=\"/f\"/>{}",
                "x".repeat(4000)
            ));
            t.nodes(&body);
        }
        assert!(
            t.len() < 20,
            "{} templates kept in a 64 KiB budget",
            t.len()
        );
    }
}
