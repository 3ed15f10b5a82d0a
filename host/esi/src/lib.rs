#![doc = include_str!("../README.md")]
//!
//! # Pieces
//!
//! - [`EsiParser`]: incremental parser. `feed`/`feed_bytes` each chunk as it
//!   arrives and get the [`Node`]s completed so far; `finish` at the end.
//!   Any split of the input into chunks gives the same result (after
//!   [`coalesce`]). Text is emitted as soon as it is seen; only bytes that may
//!   start markup (at most one tag, [`MAX_TAG_LEN`]) are held back. Plain
//!   text is scanned with `memchr`.
//! - [`Expr`]: `<esi:when test="...">` expressions (see [`expr`]); the
//!   `matches` operators run on the `regex` crate, in linear time and
//!   within size limits ([`pattern`]).
//! - [`EsiVars`]: `HTTP_HOST`, `HTTP_COOKIE{name}`, `HTTP_USER_AGENT{browser|os|version}`,
//!   `QUERY_STRING{name}`, `HTTP_ACCEPT_LANGUAGE{lang}`, `HTTP_REFERER` and
//!   custom variables set by policies.
//! - [`assemble()`]: turns a page body stream into the assembled output
//!   stream, fetching fragments through a [`FragmentFetcher`];
//!   [`assemble_parsed`] does the same from a template parsed earlier, kept
//!   by content in [`ParsedTemplates`]. A fragment the fetcher has at hand
//!   ([`Fetch::Ready`], a fresh cache hit) is written in place without a
//!   task.
//!
//! # Language
//!
//! | markup | result |
//! |---|---|
//! | `<esi:include src="..." alt="..." onerror="continue"/>` | [`Node::Include`]; also `<esi:include ...></esi:include>` (the closing tag is ignored, anything between is ordinary content). `src`/`alt` may contain variables. |
//! | `<esi:remove>...</esi:remove>` | dropped, content not parsed |
//! | `<esi:comment text="..."/>` | dropped |
//! | `<!--esi ... -->` | the wrapper is removed; the inside is processed as ESI. The first `-->` outside a tag ends it. |
//! | `<esi:choose>`/`<esi:when test>`/`<esi:otherwise>` | [`Node::Choose`], emitted when `</esi:choose>` arrives |
//! | `test="$(X) matches '''re'''"`, `matches_i` | a regular-expression search in the `regex` crate's syntax ([`expr`] has the full table of differences from the engine of earlier versions): `\d` stays ASCII and `\<` `\>` literal, as before; back-references and look-around are errors (the test is false), as before; `\b`, `\p{..}`, `(?i)` flags and named groups now work; `[` inside a class opens a nested class; `matches_i` folds Unicode case, not only ASCII. A pattern written in the page is compiled once per parsed template. |
//! | `<esi:try>`/`<esi:attempt>`/`<esi:except>` | [`Node::Try`], emitted when `</esi:try>` arrives |
//! | `<esi:vars>...</esi:vars>` | the content's `$(NAME)`, `$(NAME{key})`, `$(NAME\|default)`, `$(NAME{key}\|'default')` are substituted. Not held back: emitted as [`Node::Vars`] pieces as they complete. |
//! | anything else | passed through byte for byte, including ordinary `<!-- -->` comments and `<![CDATA[ ]]>` sections, inside which ESI markup is *not* interpreted (as Varnish does) |
//!
//! Attribute values may be in double or single quotes or unquoted; the XML
//! entities (`&amp;` `&lt;` `&gt;` `&quot;` `&apos;` `&#N;` `&#xH;`) are
//! decoded. Element and attribute names are case-sensitive, as in XML.
//!
//! # Malformed markup
//!
//! The parser never fails and never panics; what it does instead:
//!
//! | input | behaviour |
//! |---|---|
//! | unknown `<esi:foo>` / `</esi:foo>` (including `esi:inline`) | the tag is dropped, its content is ordinary content |
//! | `<esi:include>` without `src` | dropped |
//! | bad attribute syntax | junk is skipped; the first occurrence of a name wins; an unterminated quote runs to the end of the tag |
//! | tag with no `>` within [`MAX_TAG_LEN`] (64 KiB) bytes, or before the end of input | the `<` is passed through as text and scanning resumes after it |
//! | `<esi:when>`/`<esi:otherwise>` outside a choose, `<esi:attempt>`/`<esi:except>` outside a try | the tag is dropped, its content is ordinary content |
//! | content directly inside choose/try (not in a branch) | dropped (usually whitespace) |
//! | a second `otherwise`, `attempt` or `except` in the same block | ignored (the first wins) |
//! | closing tag of an outer block while inner blocks are open | the inner blocks are closed implicitly |
//! | closing tag with no open block of that kind | dropped |
//! | blocks nested deeper than [`MAX_BLOCK_NESTING`] (64) | the deeper block tags are dropped |
//! | unclosed blocks at end of input | closed implicitly (and emitted) |
//! | open blocks holding more than [`MAX_BLOCK_BYTES`] (1 MiB; text bytes, 64 per other node or block tag) | every open block is closed implicitly right there (text is split at the exact byte), as at end of input; the rest of the document is outside them and their later closing tags are dropped |
//! | unclosed `<esi:remove>` at end of input | the rest of the input is dropped |
//! | unclosed `<!--esi` or `<esi:vars>` at end of input | nothing special: the content was already emitted |
//! | `$(...)` that is malformed or longer than [`MAX_VAR_REF_LEN`] | literal text |
//! | `test` that does not parse | the branch's test is false (logged at evaluation) |
//! | `matches` pattern that does not compile or is over a limit of [`pattern`], or a subject over 8 KiB | the test is false (logged at evaluation) |
//!
//! Blocks are buffered until their closing tag (their content cannot be
//! chosen before); [`MAX_BLOCK_BYTES`] bounds what a page that opens a block
//! and never closes it makes the parser hold.
//!
//! # Assembly
//!
//! See [`assemble()`] and [`EsiLimits`]. In short: includes start as soon as
//! they are parsed (in parallel, `max_concurrency` per page); ESI fragments
//! (`Fragment::esi`) are assembled recursively to `max_depth`; output keeps
//! document order. An include fails on a non-2xx status, a fetch or body
//! error, its timeout, the page deadline or the include budget; then `alt`
//! is fetched the same way; if that fails too, `onerror="continue"` inserts
//! nothing; otherwise the failure goes to the enclosing `esi:attempt` (which
//! selects `esi:except`), or to the enclosing ESI fragment (a failure of
//! *its* include, so its `alt`/`onerror` apply). A failure that nothing of
//! these handles leaves the failed include out and the page goes on
//! ([`OnIncludeError::Omit`], the default; reported to
//! [`FragmentFetcher::omitted`]); with [`OnIncludeError::Fail`] (ESI 1.0) it
//! ends the page instead: the output stream yields an [`EsiError`] after what
//! was already sent. An include that would nest deeper than `max_depth` is
//! always left out, as Varnish does. A fragment that fails after part of it
//! was written cannot be replaced by `alt`: when it is left out, only the
//! rest of it is skipped. `esi:attempt` content is buffered until all of it
//! is ready; `esi:except` is only fetched after the attempt failed. Every
//! failure is logged (`tracing` warn) with the src and the reason.
//!
//! Buffering: page text read while an include ahead of it is pending is
//! held; past [`MAX_PAGE_AHEAD`] (16 MiB) the page body is not read further
//! until that include is written. Fragment output that arrives before its
//! turn, and `esi:attempt` content, is charged to a per-page budget
//! ([`EsiLimits::max_buffered_bytes`]): a fragment that is ahead waits for
//! room (giving back its concurrency slot, its include timeout extended by
//! the wait); the front of the page waits only for the client (a
//! second budget of the same size), never for output behind it; an attempt over the budget
//! fails over to `esi:except`. An ESI fragment's text behind a pending
//! include of its own is charged too: its body is not read further while
//! the budget is full.

pub mod assemble;
pub mod expr;
pub mod parser;
pub mod pattern;
pub mod templates;
pub mod vars;

pub use assemble::{
    EsiError, EsiLimits, FailureReason, Fetch, Fragment, FragmentError, FragmentFetcher,
    MAX_PAGE_AHEAD, OnIncludeError, assemble, assemble_parsed,
};
pub use expr::{CmpOp, EvalError, Expr, ExprError};
pub use parser::{
    Choose, EsiParser, Include, MAX_BLOCK_BYTES, MAX_BLOCK_NESTING, MAX_TAG_LEN, Node, Try, When,
    coalesce, parse,
};
pub use templates::ParsedTemplates;
pub use vars::{EsiVars, MAX_VAR_REF_LEN, Template, TemplatePart, VarRef};

/// The error type of body streams.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;
