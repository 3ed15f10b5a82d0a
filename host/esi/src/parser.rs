//! The streaming ESI 1.0 parser. See the module documentation of
//! [`crate`] for the language and for what happens with malformed
//! markup.

use bytes::{Buf, Bytes, BytesMut};
use memchr::{memchr, memchr2, memchr3};
use tracing::{debug, warn};

use super::expr::{Expr, ExprError};
use super::vars::{EsiVars, Template, TemplatePart, VarScan, scan_var_ref};

/// Longest ESI tag (from `<` to `>`) recognised. A longer one is passed
/// through as text.
pub const MAX_TAG_LEN: usize = 64 * 1024;

/// Deepest nesting of choose/when/otherwise/try/attempt/except blocks.
/// Deeper block tags are dropped (their content is kept as ordinary content).
pub const MAX_BLOCK_NESTING: usize = 64;

/// Most content held in open choose/try blocks (they are buffered until
/// they close): text bytes, plus 64 for every other node and
/// every block tag. Past it, every open block is closed implicitly there, as
/// at the end of input, and the rest of the document is outside them.
pub const MAX_BLOCK_BYTES: usize = 1024 * 1024;

/// What a node other than text counts against [`MAX_BLOCK_BYTES`].
const NODE_WEIGHT: usize = 64;

/// Most whitespace tolerated between `</esi:remove` and `>`.
const MAX_CLOSE_WS: usize = 16;

/// A parsed piece of an ESI document.
#[derive(Debug, Clone, PartialEq)]
pub enum Node {
    /// Bytes passed through unchanged.
    Text(Bytes),
    /// `<esi:include>`.
    Include(Include),
    /// `<esi:choose>`.
    Choose(Choose),
    /// `<esi:try>`.
    Try(Try),
    /// Text inside `<esi:vars>`, with variables to substitute.
    Vars(Template),
}

/// `<esi:include src="..." alt="..." onerror="continue"/>`.
#[derive(Debug, Clone, PartialEq)]
pub struct Include {
    /// The fragment to fetch (variables substituted at assembly time).
    pub src: Template,
    /// Fetched when `src` fails.
    pub alt: Option<Template>,
    /// `onerror="continue"`: when src and alt fail, insert nothing and go on.
    pub onerror_continue: bool,
}

/// One `<esi:when test="...">` branch.
#[derive(Debug, Clone, PartialEq)]
pub struct When {
    /// The parsed test; a test that does not parse is false.
    pub test: Result<Expr, ExprError>,
    /// The test as written (entity-decoded), for logs.
    pub test_text: String,
    /// Content used when the test is the first true one.
    pub body: Vec<Node>,
}

/// `<esi:choose>` with its branches.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Choose {
    /// `<esi:when>` branches in document order.
    pub whens: Vec<When>,
    /// `<esi:otherwise>` content (empty when absent).
    pub otherwise: Vec<Node>,
}

/// `<esi:try>`: `attempt`, and `except` if anything in the attempt fails.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Try {
    /// `<esi:attempt>` content.
    pub attempt: Vec<Node>,
    /// `<esi:except>` content.
    pub except: Vec<Node>,
}

impl Choose {
    /// The content of the first `when` whose test is true, else `otherwise`.
    /// A test that does not parse or evaluate counts as false and is logged.
    pub fn select(&self, vars: &EsiVars) -> &[Node] {
        match self.selected(vars) {
            Some(i) => &self.whens[i].body,
            None => &self.otherwise,
        }
    }

    /// [`Choose::select`], taking the content out.
    pub fn selected_body(&self, vars: &EsiVars) -> &[Node] {
        match self.selected(vars) {
            Some(i) => &self.whens[i].body,
            None => &self.otherwise,
        }
    }

    fn selected(&self, vars: &EsiVars) -> Option<usize> {
        self.whens.iter().position(|w| match &w.test {
            Ok(e) => e.eval(vars).unwrap_or_else(|err| {
                warn!(test = %w.test_text, error = %err, "esi:when test failed; treated as false");
                false
            }),
            Err(err) => {
                warn!(test = %w.test_text, error = %err, "esi:when test does not parse; treated as false");
                false
            }
        })
    }
}

/// Merge adjacent text and adjacent vars nodes and drop empty ones, in
/// blocks too. Parsing the same input in different chunks gives the same
/// coalesced result.
pub fn coalesce(nodes: Vec<Node>) -> Vec<Node> {
    let mut out: Vec<Node> = Vec::with_capacity(nodes.len());
    for node in nodes {
        let node = match node {
            Node::Text(b) if b.is_empty() => continue,
            Node::Vars(t) if t.parts.is_empty() => continue,
            Node::Choose(c) => Node::Choose(Choose {
                whens: c
                    .whens
                    .into_iter()
                    .map(|w| When {
                        body: coalesce(w.body),
                        ..w
                    })
                    .collect(),
                otherwise: coalesce(c.otherwise),
            }),
            Node::Try(t) => Node::Try(Try {
                attempt: coalesce(t.attempt),
                except: coalesce(t.except),
            }),
            n => n,
        };
        match (out.last_mut(), node) {
            (Some(Node::Text(a)), Node::Text(b)) => {
                let mut m = BytesMut::with_capacity(a.len() + b.len());
                m.extend_from_slice(a);
                m.extend_from_slice(&b);
                *a = m.freeze();
            }
            (Some(Node::Vars(a)), Node::Vars(b)) => a.append(b),
            (_, node) => out.push(node),
        }
    }
    out
}

/// Parse a whole document at once.
pub fn parse(input: &[u8]) -> Vec<Node> {
    let mut p = EsiParser::new();
    let mut nodes = p.feed(input);
    nodes.extend(p.finish());
    nodes
}

#[derive(Debug, PartialEq, Eq)]
enum Mode {
    /// Ordinary content: look for ESI markup.
    Markup,
    /// Inside `<esi:remove>`: drop everything up to `</esi:remove>`.
    Remove,
    /// Inside `<!-- ... -->`: pass through without interpretation.
    HtmlComment,
    /// Inside `<![CDATA[ ... ]]>`: pass through without interpretation.
    Cdata,
}

#[derive(Debug, PartialEq, Eq)]
enum BlockKind {
    Choose,
    When,
    Otherwise,
    Try,
    Attempt,
    Except,
}

#[derive(Debug)]
enum Frame {
    Choose {
        whens: Vec<When>,
        otherwise: Option<Vec<Node>>,
    },
    When {
        test: Result<Expr, ExprError>,
        test_text: String,
        body: Vec<Node>,
    },
    Otherwise(Vec<Node>),
    Try {
        attempt: Option<Vec<Node>>,
        except: Option<Vec<Node>>,
    },
    Attempt(Vec<Node>),
    Except(Vec<Node>),
}

impl Frame {
    fn kind(&self) -> BlockKind {
        match self {
            Frame::Choose { .. } => BlockKind::Choose,
            Frame::When { .. } => BlockKind::When,
            Frame::Otherwise(_) => BlockKind::Otherwise,
            Frame::Try { .. } => BlockKind::Try,
            Frame::Attempt(_) => BlockKind::Attempt,
            Frame::Except(_) => BlockKind::Except,
        }
    }
}

/// Progress through an ESI tag whose `>` has not arrived yet.
#[derive(Debug)]
struct TagScan {
    /// Bytes of the tag already scanned.
    pos: usize,
    /// The quote we are inside, if any.
    quote: Option<u8>,
}

/// What a `<` at the start of the input begins.
#[derive(Debug)]
enum LtKind {
    /// `<esi:` or `</esi:`.
    EsiTag,
    /// `<!--esi`.
    EsiComment,
    /// `<!--` (not followed by `esi`).
    HtmlComment,
    /// `<![CDATA[`.
    Cdata,
    /// Anything else: ordinary text.
    Text,
    /// Too few bytes to tell.
    NeedMore,
}

const ESI_OPEN: &[u8] = b"<esi:";
const ESI_CLOSE: &[u8] = b"</esi:";
const ESI_COMMENT: &[u8] = b"<!--esi";
const HTML_COMMENT: &[u8] = b"<!--";
const CDATA: &[u8] = b"<![CDATA[";

fn classify_lt(d: &[u8], eof: bool, in_esi_comment: bool) -> LtKind {
    match d.get(1) {
        None => {
            return if eof { LtKind::Text } else { LtKind::NeedMore };
        }
        Some(b'e' | b'/' | b'!') => {}
        Some(_) => return LtKind::Text,
    }
    if d.starts_with(ESI_OPEN) || d.starts_with(ESI_CLOSE) {
        return LtKind::EsiTag;
    }
    if d.starts_with(CDATA) {
        return LtKind::Cdata;
    }
    if d.starts_with(HTML_COMMENT) {
        if in_esi_comment {
            // HTML comments do not nest: the first `-->` ends the ESI comment.
            return LtKind::Text;
        }
        if d.starts_with(ESI_COMMENT) {
            return LtKind::EsiComment;
        }
        if !eof && d.len() < ESI_COMMENT.len() && ESI_COMMENT.starts_with(d) {
            return LtKind::NeedMore;
        }
        return LtKind::HtmlComment;
    }
    if !eof
        && [ESI_OPEN, ESI_CLOSE, HTML_COMMENT, CDATA]
            .iter()
            .any(|p| d.len() < p.len() && p.starts_with(d))
    {
        return LtKind::NeedMore;
    }
    LtKind::Text
}

/// The input not yet consumed: either the chunk just fed (zero-copy) or the
/// parser's buffer when bytes were held back from an earlier chunk.
trait Window {
    fn data(&self) -> &[u8];
    fn take(&mut self, n: usize) -> Bytes;
    fn skip(&mut self, n: usize);
}

impl Window for Bytes {
    fn data(&self) -> &[u8] {
        self
    }
    fn take(&mut self, n: usize) -> Bytes {
        self.split_to(n)
    }
    fn skip(&mut self, n: usize) {
        self.advance(n);
    }
}

impl Window for BytesMut {
    fn data(&self) -> &[u8] {
        self
    }
    fn take(&mut self, n: usize) -> Bytes {
        self.split_to(n).freeze()
    }
    fn skip(&mut self, n: usize) {
        self.advance(n);
    }
}

enum Step {
    Continue,
    NeedMore,
}

/// Streaming ESI parser: feed chunks as they arrive, get nodes as soon as
/// they are complete.
#[derive(Debug)]
pub struct EsiParser {
    /// Bytes held back because they may start markup that is not complete.
    buf: BytesMut,
    mode: Mode,
    /// Inside `<!--esi ... -->`.
    esi_comment: bool,
    /// Open `<esi:vars>` elements.
    vars_depth: u32,
    /// Open blocks, innermost last.
    stack: Vec<Frame>,
    /// Completed top-level nodes not yet returned.
    out: Vec<Node>,
    /// Progress through an incomplete tag at the start of `buf`.
    tag_scan: Option<TagScan>,
    /// What the open blocks hold (see [`MAX_BLOCK_BYTES`]).
    held: usize,
}

impl Default for EsiParser {
    fn default() -> Self {
        EsiParser::new()
    }
}

fn push_node(list: &mut Vec<Node>, node: Node) {
    match (list.last_mut(), node) {
        (Some(Node::Vars(a)), Node::Vars(b)) => a.append(b),
        (_, node) => list.push(node),
    }
}

/// Decode the XML predefined entities and numeric character references.
fn decode_entities(v: &[u8]) -> Vec<u8> {
    if memchr(b'&', v).is_none() {
        return v.to_vec();
    }
    let mut out = Vec::with_capacity(v.len());
    let mut i = 0;
    while i < v.len() {
        if v[i] == b'&'
            && let Some(end) = v[i..].iter().take(12).position(|&c| c == b';')
        {
            let name = &v[i + 1..i + end];
            let decoded: Option<char> = match name {
                b"amp" => Some('&'),
                b"lt" => Some('<'),
                b"gt" => Some('>'),
                b"quot" => Some('"'),
                b"apos" => Some('\''),
                [b'#', b'x' | b'X', hex @ ..] => std::str::from_utf8(hex)
                    .ok()
                    .and_then(|h| u32::from_str_radix(h, 16).ok())
                    .and_then(char::from_u32),
                [b'#', dec @ ..] => std::str::from_utf8(dec)
                    .ok()
                    .and_then(|d| d.parse::<u32>().ok())
                    .and_then(char::from_u32),
                _ => None,
            };
            if let Some(c) = decoded {
                let mut tmp = [0u8; 4];
                out.extend_from_slice(c.encode_utf8(&mut tmp).as_bytes());
                i += end + 1;
                continue;
            }
        }
        out.push(v[i]);
        i += 1;
    }
    out
}

/// Attributes of a tag (`rest` is what follows the tag name, without `>`).
/// First occurrence of a name wins; junk is skipped.
fn parse_attrs(rest: &[u8]) -> Vec<(Vec<u8>, Vec<u8>)> {
    let mut attrs: Vec<(Vec<u8>, Vec<u8>)> = Vec::new();
    let mut i = 0;
    let n = rest.len();
    let is_ws = |c: u8| c.is_ascii_whitespace();
    while i < n {
        while i < n && (is_ws(rest[i]) || rest[i] == b'/') {
            i += 1;
        }
        let name_start = i;
        while i < n && !is_ws(rest[i]) && !matches!(rest[i], b'=' | b'/' | b'"' | b'\'') {
            i += 1;
        }
        if i == name_start {
            // A stray `=` or quote: skip it.
            i += 1;
            continue;
        }
        let name = rest[name_start..i].to_vec();
        while i < n && is_ws(rest[i]) {
            i += 1;
        }
        let mut value = Vec::new();
        if i < n && rest[i] == b'=' {
            i += 1;
            while i < n && is_ws(rest[i]) {
                i += 1;
            }
            if i < n && (rest[i] == b'"' || rest[i] == b'\'') {
                let q = rest[i];
                let start = i + 1;
                let end = memchr(q, &rest[start..]).map_or(n, |o| start + o);
                value = decode_entities(&rest[start..end]);
                i = (end + 1).min(n);
            } else {
                let start = i;
                while i < n && !is_ws(rest[i]) {
                    i += 1;
                }
                let mut v = &rest[start..i];
                // `a=b/>`: the slash closes the tag.
                if i == n {
                    v = v.strip_suffix(b"/").unwrap_or(v);
                }
                value = decode_entities(v);
            }
        }
        if !attrs.iter().any(|(k, _)| *k == name) {
            attrs.push((name, value));
        }
    }
    attrs
}

fn attr<'a>(attrs: &'a [(Vec<u8>, Vec<u8>)], name: &str) -> Option<&'a [u8]> {
    attrs
        .iter()
        .find(|(k, _)| k == name.as_bytes())
        .map(|(_, v)| v.as_slice())
}

/// Does `d` (starting with `<`) begin `</esi:remove>`? Returns the length of
/// the closing tag, `Err(true)` when more input is needed, `Err(false)` when not.
fn match_remove_close(d: &[u8], eof: bool) -> Result<usize, bool> {
    const PREFIX: &[u8] = b"</esi:remove";
    let k = d.len().min(PREFIX.len());
    if d[..k] != PREFIX[..k] {
        return Err(false);
    }
    if k < PREFIX.len() {
        return Err(!eof);
    }
    let mut i = PREFIX.len();
    while i < d.len() && i - PREFIX.len() <= MAX_CLOSE_WS {
        match d[i] {
            b'>' => return Ok(i + 1),
            c if c.is_ascii_whitespace() => i += 1,
            _ => return Err(false),
        }
    }
    if i - PREFIX.len() > MAX_CLOSE_WS {
        return Err(false);
    }
    Err(!eof)
}

impl EsiParser {
    /// A parser at the start of a document.
    pub fn new() -> EsiParser {
        EsiParser {
            buf: BytesMut::new(),
            mode: Mode::Markup,
            esi_comment: false,
            vars_depth: 0,
            stack: Vec::new(),
            out: Vec::new(),
            tag_scan: None,
            held: 0,
        }
    }

    /// Feed the next chunk (copied); returns the nodes completed so far.
    pub fn feed(&mut self, chunk: &[u8]) -> Vec<Node> {
        self.feed_bytes(Bytes::copy_from_slice(chunk))
    }

    /// Feed the next chunk; text nodes share its memory when possible.
    pub fn feed_bytes(&mut self, chunk: Bytes) -> Vec<Node> {
        if self.buf.is_empty() {
            let mut w = chunk;
            self.run(&mut w, false);
            if !w.is_empty() {
                self.buf.extend_from_slice(&w);
            }
        } else {
            self.buf.extend_from_slice(&chunk);
            let mut w = std::mem::take(&mut self.buf);
            self.run(&mut w, false);
            self.buf = w;
        }
        std::mem::take(&mut self.out)
    }

    /// Bytes currently held back (a possible tag start not yet complete).
    pub fn pending_len(&self) -> usize {
        self.buf.len()
    }

    /// End of input: flush what was held back and close open blocks.
    pub fn finish(mut self) -> Vec<Node> {
        let mut w = std::mem::take(&mut self.buf);
        self.run(&mut w, true);
        debug_assert!(w.is_empty(), "eof run consumes everything");
        if self.mode == Mode::Remove {
            debug!("esi: unclosed <esi:remove>; its content was dropped");
        }
        if self.esi_comment {
            debug!("esi: unclosed <!--esi comment");
        }
        while !self.stack.is_empty() {
            debug!("esi: unclosed block at end of document closed implicitly");
            self.close_top();
        }
        std::mem::take(&mut self.out)
    }

    fn run<W: Window>(&mut self, w: &mut W, eof: bool) {
        while !w.data().is_empty() {
            let step = match self.mode {
                Mode::Markup => self.step_markup(w, eof),
                Mode::Remove => self.step_remove(w, eof),
                Mode::HtmlComment => self.step_passthrough(w, eof, b"-->"),
                Mode::Cdata => self.step_passthrough(w, eof, b"]]>"),
            };
            if let Step::NeedMore = step {
                debug_assert!(!eof);
                break;
            }
        }
    }

    /// Add a node to the innermost open block (or the output), counting it
    /// against [`MAX_BLOCK_BYTES`].
    fn emit(&mut self, node: Node) {
        match node {
            Node::Text(b) => self.emit_held_text(b, Node::Text),
            node => {
                self.place(node);
                self.hold(NODE_WEIGHT);
            }
        }
    }

    /// Text split exactly where the open blocks reach [`MAX_BLOCK_BYTES`], so
    /// that the result does not depend on how the input was chunked.
    fn emit_held_text(&mut self, mut b: Bytes, node: fn(Bytes) -> Node) {
        if self.stack.is_empty() {
            return self.place(node(b));
        }
        let room = MAX_BLOCK_BYTES.saturating_sub(self.held);
        if b.len() <= room {
            self.held += b.len();
            return self.place(node(b));
        }
        let inside = b.split_to(room);
        if !inside.is_empty() {
            self.place(node(inside));
        }
        self.close_all_blocks();
        self.place(node(b));
    }

    /// Count `n` more held in open blocks; past the limit, close them all.
    fn hold(&mut self, n: usize) {
        if self.stack.is_empty() {
            return;
        }
        self.held += n;
        if self.held > MAX_BLOCK_BYTES {
            self.close_all_blocks();
        }
    }

    fn close_all_blocks(&mut self) {
        debug!("esi: open blocks hold more than MAX_BLOCK_BYTES; closed implicitly");
        while !self.stack.is_empty() {
            self.close_top();
        }
        self.held = 0;
    }

    fn place(&mut self, node: Node) {
        match self.stack.last_mut() {
            None => push_node(&mut self.out, node),
            Some(
                Frame::When { body, .. }
                | Frame::Otherwise(body)
                | Frame::Attempt(body)
                | Frame::Except(body),
            ) => push_node(body, node),
            // Only when/otherwise (attempt/except) belong directly inside
            // choose (try): anything else there is dropped.
            Some(Frame::Choose { .. } | Frame::Try { .. }) => {}
        }
    }

    fn emit_text(&mut self, b: Bytes) {
        if b.is_empty() {
            return;
        }
        if self.vars_depth > 0 && self.mode == Mode::Markup {
            self.emit_held_text(b, |b| Node::Vars(Template::literal(b)));
        } else {
            self.emit_held_text(b, Node::Text);
        }
    }

    /// Ordinary content: emit text up to the next ESI construct, then handle it.
    fn step_markup<W: Window>(&mut self, w: &mut W, eof: bool) -> Step {
        if self.tag_scan.is_some() {
            return self.step_tag(w, eof);
        }
        let vars = self.vars_depth > 0;
        let comment = self.esi_comment;
        let d = w.data();
        let mut i = 0;
        loop {
            let rest = &d[i..];
            let found = match (vars, comment) {
                (false, false) => memchr(b'<', rest),
                (true, false) => memchr2(b'<', b'$', rest),
                (false, true) => memchr2(b'<', b'-', rest),
                (true, true) => memchr3(b'<', b'$', b'-', rest),
            };
            let Some(off) = found else {
                let all = d.len();
                let t = w.take(all);
                self.emit_text(t);
                return Step::Continue;
            };
            let p = i + off;
            let at = &d[p..];
            match at[0] {
                b'<' => match classify_lt(at, eof, comment) {
                    LtKind::Text => i = p + 1,
                    LtKind::NeedMore => {
                        let t = w.take(p);
                        self.emit_text(t);
                        return Step::NeedMore;
                    }
                    LtKind::HtmlComment | LtKind::Cdata => {
                        let (mode, len) = if at.starts_with(CDATA) {
                            (Mode::Cdata, CDATA.len())
                        } else {
                            (Mode::HtmlComment, HTML_COMMENT.len())
                        };
                        let t = w.take(p + len);
                        self.emit_text(t);
                        self.mode = mode;
                        return Step::Continue;
                    }
                    LtKind::EsiComment => {
                        let t = w.take(p);
                        self.emit_text(t);
                        w.skip(ESI_COMMENT.len());
                        self.esi_comment = true;
                        return Step::Continue;
                    }
                    LtKind::EsiTag => {
                        let t = w.take(p);
                        self.emit_text(t);
                        return self.step_tag(w, eof);
                    }
                },
                b'-' => {
                    let k = at.len().min(3);
                    if at[..k] != b"-->"[..k] {
                        i = p + 1;
                    } else if k == 3 {
                        let t = w.take(p);
                        self.emit_text(t);
                        w.skip(3);
                        self.esi_comment = false;
                        return Step::Continue;
                    } else if eof {
                        i = p + 1;
                    } else {
                        let t = w.take(p);
                        self.emit_text(t);
                        return Step::NeedMore;
                    }
                }
                _ => match scan_var_ref(at) {
                    VarScan::Complete(len, var) => {
                        let t = w.take(p);
                        self.emit_text(t);
                        w.skip(len);
                        self.emit(Node::Vars(Template {
                            parts: vec![TemplatePart::Var(var)],
                        }));
                        return Step::Continue;
                    }
                    VarScan::Incomplete if !eof => {
                        let t = w.take(p);
                        self.emit_text(t);
                        return Step::NeedMore;
                    }
                    VarScan::Incomplete | VarScan::Invalid => i = p + 1,
                },
            }
        }
    }

    /// An ESI tag starts at the beginning of the window: find its `>`.
    fn step_tag<W: Window>(&mut self, w: &mut W, eof: bool) -> Step {
        let d = w.data();
        let mut scan = self.tag_scan.take().unwrap_or(TagScan {
            pos: 1,
            quote: None,
        });
        let limit = d.len().min(MAX_TAG_LEN);
        let mut end = None;
        let mut i = scan.pos;
        while i < limit {
            match scan.quote {
                Some(q) => match memchr(q, &d[i..limit]) {
                    Some(o) => {
                        i += o + 1;
                        scan.quote = None;
                    }
                    None => i = limit,
                },
                None => match memchr3(b'>', b'"', b'\'', &d[i..limit]) {
                    Some(o) if d[i + o] == b'>' => {
                        end = Some(i + o);
                        break;
                    }
                    Some(o) => {
                        scan.quote = Some(d[i + o]);
                        i += o + 1;
                    }
                    None => i = limit,
                },
            }
        }
        if let Some(end) = end {
            let tag = w.take(end + 1);
            self.handle_tag(&tag);
            return Step::Continue;
        }
        if d.len() >= MAX_TAG_LEN || eof {
            debug!("esi: unterminated or over-long ESI tag passed through as text");
            let lt = w.take(1);
            self.emit_text(lt);
            return Step::Continue;
        }
        scan.pos = i;
        self.tag_scan = Some(scan);
        Step::NeedMore
    }

    /// Inside `<esi:remove>`: discard up to the closing tag.
    fn step_remove<W: Window>(&mut self, w: &mut W, eof: bool) -> Step {
        let d = w.data();
        let mut i = 0;
        while let Some(off) = memchr(b'<', &d[i..]) {
            let p = i + off;
            match match_remove_close(&d[p..], eof) {
                Ok(len) => {
                    w.skip(p + len);
                    self.mode = Mode::Markup;
                    return Step::Continue;
                }
                Err(true) => {
                    w.skip(p);
                    return Step::NeedMore;
                }
                Err(false) => i = p + 1,
            }
        }
        let all = d.len();
        w.skip(all);
        Step::Continue
    }

    /// Inside an HTML comment or CDATA section: pass through up to `end`.
    fn step_passthrough<W: Window>(&mut self, w: &mut W, eof: bool, end: &[u8]) -> Step {
        let d = w.data();
        if let Some(p) = memchr::memmem::find(d, end) {
            let t = w.take(p + end.len());
            self.emit(Node::Text(t));
            self.mode = Mode::Markup;
            return Step::Continue;
        }
        // Hold back a tail that may be the start of `end`.
        let keep = if eof {
            0
        } else {
            (1..end.len())
                .rev()
                .find(|&k| d.len() >= k && d[d.len() - k..] == end[..k])
                .unwrap_or(0)
        };
        let n = d.len() - keep;
        let t = w.take(n);
        if !t.is_empty() {
            self.emit(Node::Text(t));
        }
        if keep > 0 {
            Step::NeedMore
        } else {
            Step::Continue
        }
    }

    fn handle_tag(&mut self, tag: &[u8]) {
        let closing = tag.get(1) == Some(&b'/');
        let name_start = if closing {
            ESI_CLOSE.len()
        } else {
            ESI_OPEN.len()
        };
        let body = &tag[name_start..tag.len() - 1];
        let name_len = body
            .iter()
            .take_while(|c| c.is_ascii_alphanumeric() || **c == b'_' || **c == b'-')
            .count();
        let name = &body[..name_len];
        let rest = &body[name_len..];
        if !rest.is_empty() && !rest[0].is_ascii_whitespace() && rest[0] != b'/' {
            debug!("esi: malformed tag name dropped");
            return;
        }
        let self_closing = rest
            .iter()
            .rev()
            .find(|c| !c.is_ascii_whitespace())
            .is_some_and(|&c| c == b'/');
        if closing {
            self.close_tag(name);
        } else {
            self.open_tag(name, rest, self_closing);
        }
    }

    fn open_tag(&mut self, name: &[u8], rest: &[u8], self_closing: bool) {
        match name {
            b"include" => {
                let attrs = parse_attrs(rest);
                let Some(src) = attr(&attrs, "src") else {
                    debug!("esi: <esi:include> without src dropped");
                    return;
                };
                let include = Include {
                    src: Template::parse(src),
                    alt: attr(&attrs, "alt").map(Template::parse),
                    onerror_continue: attr(&attrs, "onerror") == Some(b"continue"),
                };
                self.emit(Node::Include(include));
            }
            b"comment" => {}
            b"remove" => {
                if !self_closing {
                    self.mode = Mode::Remove;
                }
            }
            b"vars" => {
                if !self_closing {
                    self.vars_depth = self.vars_depth.saturating_add(1);
                }
            }
            b"choose" | b"when" | b"otherwise" | b"try" | b"attempt" | b"except" => {
                if self_closing {
                    // An empty block produces nothing.
                    return;
                }
                if self.stack.len() >= MAX_BLOCK_NESTING {
                    debug!("esi: blocks nested too deeply; tag dropped");
                    return;
                }
                let top = self.stack.last().map(Frame::kind);
                let frame = match name {
                    b"choose" => Frame::Choose {
                        whens: Vec::new(),
                        otherwise: None,
                    },
                    b"try" => Frame::Try {
                        attempt: None,
                        except: None,
                    },
                    b"when" if top == Some(BlockKind::Choose) => {
                        let attrs = parse_attrs(rest);
                        let raw = attr(&attrs, "test").unwrap_or_default();
                        let test_text = String::from_utf8_lossy(raw).into_owned();
                        Frame::When {
                            test: Expr::parse(&test_text),
                            test_text,
                            body: Vec::new(),
                        }
                    }
                    b"otherwise" if top == Some(BlockKind::Choose) => Frame::Otherwise(Vec::new()),
                    b"attempt" if top == Some(BlockKind::Try) => Frame::Attempt(Vec::new()),
                    b"except" if top == Some(BlockKind::Try) => Frame::Except(Vec::new()),
                    _ => {
                        debug!(
                            tag = %String::from_utf8_lossy(name),
                            "esi: misplaced tag dropped"
                        );
                        return;
                    }
                };
                if self.stack.is_empty() {
                    self.held = 0;
                }
                self.stack.push(frame);
                self.hold(NODE_WEIGHT);
            }
            _ => debug!(
                tag = %String::from_utf8_lossy(name),
                "esi: unknown tag dropped"
            ),
        }
    }

    fn close_tag(&mut self, name: &[u8]) {
        let kind = match name {
            b"choose" => BlockKind::Choose,
            b"when" => BlockKind::When,
            b"otherwise" => BlockKind::Otherwise,
            b"try" => BlockKind::Try,
            b"attempt" => BlockKind::Attempt,
            b"except" => BlockKind::Except,
            b"vars" => {
                self.vars_depth = self.vars_depth.saturating_sub(1);
                return;
            }
            // Empty elements and stray closing tags: nothing to do.
            _ => return,
        };
        match self.stack.iter().rposition(|f| f.kind() == kind) {
            Some(idx) => {
                while self.stack.len() > idx + 1 {
                    debug!("esi: block closed implicitly by an outer closing tag");
                    self.close_top();
                }
                self.close_top();
            }
            None => debug!(
                tag = %String::from_utf8_lossy(name),
                "esi: stray closing tag dropped"
            ),
        }
    }

    fn close_top(&mut self) {
        let Some(frame) = self.stack.pop() else {
            return;
        };
        match frame {
            Frame::When {
                test,
                test_text,
                body,
            } => {
                if let Some(Frame::Choose { whens, .. }) = self.stack.last_mut() {
                    whens.push(When {
                        test,
                        test_text,
                        body,
                    });
                }
            }
            Frame::Otherwise(body) => {
                if let Some(Frame::Choose { otherwise, .. }) = self.stack.last_mut() {
                    otherwise.get_or_insert(body);
                }
            }
            Frame::Attempt(body) => {
                if let Some(Frame::Try { attempt, .. }) = self.stack.last_mut() {
                    attempt.get_or_insert(body);
                }
            }
            Frame::Except(body) => {
                if let Some(Frame::Try { except, .. }) = self.stack.last_mut() {
                    except.get_or_insert(body);
                }
            }
            Frame::Choose { whens, otherwise } => self.place(Node::Choose(Choose {
                whens,
                otherwise: otherwise.unwrap_or_default(),
            })),
            Frame::Try { attempt, except } => self.place(Node::Try(Try {
                attempt: attempt.unwrap_or_default(),
                except: except.unwrap_or_default(),
            })),
        }
    }
}

#[cfg(test)]
mod tests;
