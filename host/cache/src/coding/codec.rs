//! The encoders and decoders of the content codings Inlay makes and reads
//! (gzip, br, zstd), as one step at a time over byte slices, and the stream
//! transform that runs them over a body as it streams.
//!
//! Written over the crates' own encoders and raw decoders rather than
//! through `async-compression`: a body here is a stream of `Bytes`, not an
//! `AsyncRead`, and every step must be bounded in what it makes.
//!
//! Decoding is bounded however well the input compresses (a bomb): a step
//! makes at most [`DECODE_OUT`] bytes for br and zstd (their raw decoders
//! fill a buffer of that size and stop), and at most about 1 MiB for gzip
//! (it takes [`DECODE_STEP`] compressed bytes at a time, and deflate expands
//! at most 1032:1); the next step runs only when the reader asks for more.
//! Windows are bounded too: br to RFC 7932's 16 MiB (not the large-window
//! extension), zstd to the 8 MiB RFC 9659 sets for the `zstd` coding.

use std::io::{self, Write};

use bytes::{Buf, Bytes, BytesMut};
use flate2::write::{GzDecoder, GzEncoder};
use futures_util::stream::{BoxStream, StreamExt};
use inlay_core::body::BoxError;

use super::Coding;

/// Compressed gzip bytes decoded at a time. Deflate expands at most 1032:1,
/// so one step makes at most about 1 MiB.
pub const DECODE_STEP: usize = 1024;
/// Most bytes one br or zstd decoding step makes.
pub const DECODE_OUT: usize = 64 * 1024;
/// The br window of a stored or streamed body: 4 MiB (br's default).
const BR_WINDOW_BITS: u32 = 22;
/// zstd's window bound for the `zstd` content coding (RFC 9659): 8 MiB.
const ZSTD_WINDOW_LOG_MAX: u32 = 23;

/// Encodes `data` whole in `coding` at `level` (no flushes: the smallest
/// output), as a fill does once for the store.
pub fn encode(coding: Coding, level: i32, data: &[u8]) -> io::Result<Vec<u8>> {
    let mut e = Encoder::new(coding, level)?;
    e.write(data)?;
    e.finish()
}

/// An encoder writing into its own buffer, emptied by [`Encoder::take`].
enum Encoder {
    Gzip(GzEncoder<Vec<u8>>),
    Br(Box<brotli::CompressorWriter<Vec<u8>>>),
    Zstd(zstd::stream::write::Encoder<'static, Vec<u8>>),
}

impl Encoder {
    fn new(coding: Coding, level: i32) -> io::Result<Self> {
        let level = level.max(0);
        Ok(match coding {
            Coding::Gzip => Encoder::Gzip(GzEncoder::new(
                Vec::new(),
                flate2::Compression::new(level.clamp(1, 9) as u32),
            )),
            Coding::Br => Encoder::Br(Box::new(brotli::CompressorWriter::new(
                Vec::new(),
                4096,
                level.min(11) as u32,
                BR_WINDOW_BITS,
            ))),
            Coding::Zstd => {
                Encoder::Zstd(zstd::stream::write::Encoder::new(Vec::new(), level.max(1))?)
            }
        })
    }

    fn write(&mut self, data: &[u8]) -> io::Result<()> {
        match self {
            Encoder::Gzip(e) => e.write_all(data),
            Encoder::Br(e) => e.write_all(data),
            Encoder::Zstd(e) => e.write_all(data),
        }
    }

    /// Makes what was written so far decodable (a sync flush): the client
    /// can render it before the rest comes.
    fn flush(&mut self) -> io::Result<()> {
        match self {
            Encoder::Gzip(e) => e.flush(),
            Encoder::Br(e) => e.flush(),
            Encoder::Zstd(e) => e.flush(),
        }
    }

    /// The output made so far.
    fn take(&mut self) -> Vec<u8> {
        std::mem::take(match self {
            Encoder::Gzip(e) => e.get_mut(),
            Encoder::Br(e) => e.get_mut(),
            Encoder::Zstd(e) => e.get_mut(),
        })
    }

    /// The rest of the output, the stream closed.
    fn finish(self) -> io::Result<Vec<u8>> {
        match self {
            Encoder::Gzip(e) => e.finish(),
            Encoder::Br(e) => Ok(e.into_inner()),
            Encoder::Zstd(e) => e.finish(),
        }
    }
}

/// A decoder taking its input a slice at a time and making bounded output.
enum Decoder {
    Gzip(Box<GzDecoder<Vec<u8>>>),
    Br(Box<BrDecoder>),
    Zstd(Box<ZstdDecoder>),
}

struct BrDecoder {
    state: brotli_decompressor::BrotliState<
        brotli_decompressor::StandardAlloc,
        brotli_decompressor::StandardAlloc,
        brotli_decompressor::StandardAlloc,
    >,
    done: bool,
}

struct ZstdDecoder {
    raw: zstd::stream::raw::Decoder<'static>,
    /// The last frame is complete (the decoder's hint was 0).
    at_frame_end: bool,
}

fn corrupt(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what.to_owned())
}

impl Decoder {
    fn new(coding: Coding) -> io::Result<Self> {
        Ok(match coding {
            Coding::Gzip => Decoder::Gzip(Box::new(GzDecoder::new(Vec::new()))),
            Coding::Br => {
                use brotli_decompressor::StandardAlloc;
                let mut state = brotli_decompressor::BrotliState::new(
                    StandardAlloc::default(),
                    StandardAlloc::default(),
                    StandardAlloc::default(),
                );
                // RFC 7932's windows only (16 MiB at most).
                state.large_window = false;
                Decoder::Br(Box::new(BrDecoder { state, done: false }))
            }
            Coding::Zstd => {
                use zstd::stream::raw::{DParameter, Decoder as Raw};
                let mut raw = Raw::new()?;
                raw.set_parameter(DParameter::WindowLogMax(ZSTD_WINDOW_LOG_MAX))?;
                Decoder::Zstd(Box::new(ZstdDecoder {
                    raw,
                    at_frame_end: true,
                }))
            }
        })
    }

    /// Decodes from the front of `input` and returns what it made (bounded,
    /// see the module) and how many input bytes it used; nothing made and
    /// nothing used means it needs more input.
    fn step(&mut self, input: &[u8]) -> io::Result<(Vec<u8>, usize)> {
        match self {
            Decoder::Gzip(d) => {
                let used = input.len().min(DECODE_STEP);
                d.write_all(&input[..used])?;
                // Out of the decoder's own buffer, so that what a step
                // decoded is returned now, not with the next step.
                d.flush()?;
                Ok((std::mem::take(d.get_mut()), used))
            }
            Decoder::Br(d) => {
                use brotli_decompressor::{BrotliDecompressStream, BrotliResult};
                if d.done {
                    return match input.is_empty() {
                        true => Ok((Vec::new(), 0)),
                        false => Err(corrupt("data after the end of a br stream")),
                    };
                }
                let mut out = vec![0u8; DECODE_OUT];
                let (mut avail_in, mut in_off) = (input.len(), 0usize);
                let (mut avail_out, mut out_off, mut total) = (out.len(), 0usize, 0usize);
                let result = BrotliDecompressStream(
                    &mut avail_in,
                    &mut in_off,
                    input,
                    &mut avail_out,
                    &mut out_off,
                    &mut out,
                    &mut total,
                    &mut d.state,
                );
                match result {
                    BrotliResult::ResultFailure => return Err(corrupt("corrupt br stream")),
                    BrotliResult::ResultSuccess => d.done = true,
                    BrotliResult::NeedsMoreInput | BrotliResult::NeedsMoreOutput => {}
                }
                out.truncate(out_off);
                Ok((out, in_off))
            }
            Decoder::Zstd(d) => {
                use zstd::stream::raw::{InBuffer, Operation, OutBuffer};
                let mut out = vec![0u8; DECODE_OUT];
                let mut inb = InBuffer::around(input);
                let mut outb = OutBuffer::around(&mut out[..]);
                let hint = d.raw.run(&mut inb, &mut outb)?;
                let made = outb.pos();
                if made > 0 || inb.pos > 0 {
                    d.at_frame_end = hint == 0;
                }
                let used = inb.pos;
                out.truncate(made);
                Ok((out, used))
            }
        }
    }

    /// At the end of the input: the rest of the output, a piece at a time
    /// (empty when done); an error when the stream was cut short.
    fn finish_step(&mut self) -> io::Result<Vec<u8>> {
        match self {
            Decoder::Gzip(d) => {
                d.try_finish()?;
                Ok(std::mem::take(d.get_mut()))
            }
            Decoder::Br(_) | Decoder::Zstd(_) => {
                let (out, _) = self.step(&[])?;
                if !out.is_empty() {
                    return Ok(out);
                }
                let complete = match self {
                    Decoder::Br(d) => d.done,
                    Decoder::Zstd(d) => d.at_frame_end,
                    Decoder::Gzip(_) => true,
                };
                match complete {
                    true => Ok(Vec::new()),
                    false => Err(corrupt("the compressed body ended early")),
                }
            }
        }
    }
}

/// One side of a stream transform.
enum Codec {
    /// `None` once finished (finishing consumes the encoder).
    Encode(Option<Encoder>),
    Decode(Decoder),
}

impl Codec {
    fn step(&mut self, input: &[u8]) -> io::Result<(Vec<u8>, usize)> {
        match self {
            Codec::Encode(None) => Ok((Vec::new(), 0)),
            Codec::Encode(Some(e)) => {
                if input.is_empty() {
                    return Ok((Vec::new(), 0));
                }
                e.write(input)?;
                // A sync flush per chunk: the client can render what it has.
                e.flush()?;
                Ok((e.take(), input.len()))
            }
            Codec::Decode(d) => d.step(input),
        }
    }
}

/// State of a transform between two pieces of output.
struct Transform<E> {
    input: BoxStream<'static, Result<Bytes, E>>,
    codec: Codec,
    pending: Bytes,
    /// The input has ended: the codec is being finished.
    ended: bool,
}

fn transform<E: Into<BoxError> + Send + 'static>(
    input: BoxStream<'static, Result<Bytes, E>>,
    codec: Codec,
) -> BoxStream<'static, Result<Bytes, BoxError>> {
    let start = Transform {
        input,
        codec,
        pending: Bytes::new(),
        ended: false,
    };
    futures_util::stream::unfold(Some(start), |state| async move {
        let mut t = state?;
        let failed = |e: io::Error| Some((Err(Box::new(e) as BoxError), None));
        loop {
            if t.ended {
                return match &mut t.codec {
                    Codec::Decode(d) => match d.finish_step() {
                        Ok(out) if out.is_empty() => None,
                        Ok(out) => Some((Ok(Bytes::from(out)), Some(t))),
                        Err(e) => failed(e),
                    },
                    Codec::Encode(e) => match e.take()?.finish() {
                        Ok(out) if out.is_empty() => None,
                        Ok(out) => Some((Ok(Bytes::from(out)), None)),
                        Err(e) => failed(e),
                    },
                };
            }
            match t.codec.step(&t.pending) {
                Err(e) => return failed(e),
                Ok((out, used)) => {
                    t.pending.advance(used);
                    if !out.is_empty() {
                        return Some((Ok(Bytes::from(out)), Some(t)));
                    }
                    if used > 0 {
                        continue;
                    }
                }
            }
            // The codec needs more input.
            match t.input.next().await {
                Some(Ok(chunk)) => {
                    t.pending = if t.pending.is_empty() {
                        chunk
                    } else {
                        let mut joined = BytesMut::with_capacity(t.pending.len() + chunk.len());
                        joined.extend_from_slice(&t.pending);
                        joined.extend_from_slice(&chunk);
                        joined.freeze()
                    };
                }
                Some(Err(e)) => return Some((Err(e.into()), None)),
                None => t.ended = true,
            }
        }
    })
    .boxed()
}

/// Decodes a body in `coding` as it streams, in bounded pieces (see the
/// module). A corrupt or truncated stream ends in an error.
pub fn decode_stream<E: Into<BoxError> + Send + 'static>(
    input: BoxStream<'static, Result<Bytes, E>>,
    coding: Coding,
) -> BoxStream<'static, Result<Bytes, BoxError>> {
    match Decoder::new(coding) {
        Ok(d) => transform(input, Codec::Decode(d)),
        Err(e) => futures_util::stream::once(async move { Err(Box::new(e) as BoxError) }).boxed(),
    }
}

/// Encodes a body in `coding` at `level` as it streams, flushing after
/// every chunk so that what came is sent at once.
pub fn encode_stream<E: Into<BoxError> + Send + 'static>(
    input: BoxStream<'static, Result<Bytes, E>>,
    coding: Coding,
    level: i32,
) -> BoxStream<'static, Result<Bytes, BoxError>> {
    match Encoder::new(coding, level) {
        Ok(e) => transform(input, Codec::Encode(Some(e))),
        Err(e) => futures_util::stream::once(async move { Err(Box::new(e) as BoxError) }).boxed(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text() -> Vec<u8> {
        (0..20_000u32)
            .flat_map(|i| format!("<li>{}</li>", i % 777).into_bytes())
            .collect()
    }

    fn chunks(data: &[u8], n: usize) -> BoxStream<'static, Result<Bytes, BoxError>> {
        let v: Vec<Result<Bytes, BoxError>> = data
            .chunks(n)
            .map(|c| Ok(Bytes::copy_from_slice(c)))
            .collect();
        futures_util::stream::iter(v).boxed()
    }

    async fn collect(s: BoxStream<'static, Result<Bytes, BoxError>>) -> Result<Vec<u8>, String> {
        let mut out = Vec::new();
        let mut s = s;
        while let Some(piece) = s.next().await {
            out.extend_from_slice(&piece.map_err(|e| e.to_string())?);
        }
        Ok(out)
    }

    #[tokio::test]
    async fn every_coding_round_trips_whole_and_streamed_in_small_chunks() {
        let text = text();
        for coding in Coding::ALL {
            let whole = encode(coding, 5, &text).unwrap();
            assert!(whole.len() < text.len() / 3, "{coding:?}");
            let back = collect(decode_stream(chunks(&whole, 13), coding)).await;
            assert_eq!(back.unwrap(), text, "{coding:?}");
            let streamed = collect(encode_stream(chunks(&text, 777), coding, 3))
                .await
                .unwrap();
            let back = collect(decode_stream(chunks(&streamed, 100), coding)).await;
            assert_eq!(back.unwrap(), text, "{coding:?} streamed");
            // An empty body is a valid, empty stream.
            let empty = collect(encode_stream(chunks(&[], 1), coding, 3)).await;
            let back = collect(decode_stream(chunks(&empty.unwrap(), 1), coding)).await;
            assert_eq!(back.unwrap(), b"", "{coding:?} empty");
        }
    }

    #[tokio::test]
    async fn each_chunk_is_decodable_when_it_is_sent() {
        // What a streamed page sent so far decodes to what came so far.
        for coding in Coding::ALL {
            let mut e = Encoder::new(coding, 4).unwrap();
            e.write(b"<html><body>first part").unwrap();
            e.flush().unwrap();
            let sent = e.take();
            let mut d = Decoder::new(coding).unwrap();
            let mut out = Vec::new();
            let mut input: &[u8] = &sent;
            loop {
                let (piece, used) = d.step(input).unwrap();
                input = &input[used..];
                out.extend_from_slice(&piece);
                if piece.is_empty() && used == 0 {
                    break;
                }
            }
            assert_eq!(out, b"<html><body>first part", "{coding:?}");
        }
    }

    #[tokio::test]
    async fn corrupt_and_truncated_streams_are_errors_not_panics() {
        let text = text();
        for coding in Coding::ALL {
            let bad = collect(decode_stream(
                chunks(b"\x1f\x8bnot compressed at all", 4),
                coding,
            ));
            assert!(bad.await.is_err(), "{coding:?}");
            let whole = encode(coding, 5, &text).unwrap();
            let cut = collect(decode_stream(chunks(&whole[..whole.len() / 2], 64), coding));
            assert!(cut.await.is_err(), "{coding:?} cut");
        }
    }

    #[tokio::test]
    async fn a_bomb_in_one_chunk_is_decoded_in_bounded_pieces() {
        // 64 MiB of zeros, delivered as one chunk (as a cached template is).
        let zeros = vec![0u8; 64 << 20];
        for coding in Coding::ALL {
            let bomb = encode(coding, 9, &zeros).unwrap();
            assert!(bomb.len() < 256 * 1024, "{coding:?}: {}", bomb.len());
            let mut out = decode_stream(chunks(&bomb, bomb.len()), coding);
            let (mut total, mut largest) = (0usize, 0usize);
            while let Some(piece) = out.next().await {
                let n = piece.unwrap().len();
                total += n;
                largest = largest.max(n);
            }
            assert_eq!(total, 64 << 20, "{coding:?}");
            // gzip: 1032:1 per step plus its 32 KiB buffer; br, zstd: one buffer.
            let bound = match coding {
                Coding::Gzip => 1032 * DECODE_STEP + 64 * 1024,
                _ => DECODE_OUT,
            };
            assert!(largest <= bound, "{coding:?}: a piece of {largest} bytes");
        }
    }

    #[test]
    fn a_zstd_frame_asking_for_a_huge_window_is_refused() {
        // A frame whose window (1 GiB) is past the coding's 8 MiB bound.
        let mut raw = zstd::stream::raw::Encoder::new(3).unwrap();
        use zstd::stream::raw::{CParameter, InBuffer, Operation, OutBuffer};
        raw.set_parameter(CParameter::WindowLog(30)).unwrap();
        raw.set_parameter(CParameter::EnableLongDistanceMatching(true))
            .unwrap();
        let data = vec![7u8; 1 << 20];
        let mut out = vec![0u8; 1 << 20];
        let mut outb = OutBuffer::around(&mut out[..]);
        let mut inb = InBuffer::around(&data[..]);
        raw.run(&mut inb, &mut outb).unwrap();
        raw.finish(&mut outb, true).unwrap();
        let n = outb.pos();
        let mut d = Decoder::new(Coding::Zstd).unwrap();
        assert!(d.step(&out[..n]).is_err());
    }
}
