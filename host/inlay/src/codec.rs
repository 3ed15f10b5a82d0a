//! Streaming gzip for ESI: decode an origin's gzip body chunk by chunk, and
//! re-encode the assembled page with a sync flush per chunk so it still
//! streams to the client.
//!
//! Decoding is bounded however large the compressed chunks are (a cached
//! template is one chunk): the decoder takes [`DECODE_STEP`] compressed bytes
//! at a time and yields what they made before taking more, so a gzip bomb
//! is decoded in pieces of at most about 1 MiB, each only when the reader
//! asks for it.

use std::io::Write;

use bytes::Bytes;
use flate2::Compression;
use flate2::write::{GzDecoder, GzEncoder};
use futures_util::stream::{BoxStream, StreamExt};
use inlay_core::body::BoxError;

/// Compressed bytes decoded at a time. Deflate expands at most 1032:1, so
/// one step makes at most about 1 MiB.
pub const DECODE_STEP: usize = 1024;

enum Codec {
    Decode(GzDecoder<Vec<u8>>),
    Encode(GzEncoder<Vec<u8>>),
}

impl Codec {
    fn push(&mut self, data: &[u8]) -> std::io::Result<Bytes> {
        match self {
            Codec::Decode(d) => {
                d.write_all(data)?;
                Ok(Bytes::from(std::mem::take(d.get_mut())))
            }
            Codec::Encode(e) => {
                e.write_all(data)?;
                // A sync flush per chunk: the client can render what it has.
                e.flush()?;
                Ok(Bytes::from(std::mem::take(e.get_mut())))
            }
        }
    }

    fn finish(self) -> std::io::Result<Bytes> {
        match self {
            Codec::Decode(d) => d.finish().map(Bytes::from),
            Codec::Encode(e) => e.finish().map(Bytes::from),
        }
    }
}

fn transform<E: Into<BoxError> + Send + 'static>(
    input: BoxStream<'static, Result<Bytes, E>>,
    codec: Codec,
) -> BoxStream<'static, Result<Bytes, BoxError>> {
    // Input still to push: decoding takes it DECODE_STEP bytes at a time.
    let step = match codec {
        Codec::Decode(_) => DECODE_STEP,
        Codec::Encode(_) => usize::MAX,
    };
    futures_util::stream::unfold(
        Some((input, codec, Bytes::new())),
        move |state| async move {
            let (mut input, mut codec, mut pending) = state?;
            loop {
                if !pending.is_empty() {
                    let piece = pending.split_to(pending.len().min(step));
                    match codec.push(&piece) {
                        Ok(out) if out.is_empty() => continue,
                        Ok(out) => return Some((Ok(out), Some((input, codec, pending)))),
                        Err(e) => return Some((Err(Box::new(e) as BoxError), None)),
                    }
                }
                match input.next().await {
                    Some(Ok(chunk)) => pending = chunk,
                    Some(Err(e)) => return Some((Err(e.into()), None)),
                    None => {
                        return match codec.finish() {
                            Ok(out) if out.is_empty() => None,
                            Ok(out) => Some((Ok(out), None)),
                            Err(e) => Some((Err(Box::new(e) as BoxError), None)),
                        };
                    }
                }
            }
        },
    )
    .boxed()
}

/// Decode a gzip body as it streams. A corrupt stream ends in an error.
pub fn gunzip<E: Into<BoxError> + Send + 'static>(
    input: BoxStream<'static, Result<Bytes, E>>,
) -> BoxStream<'static, Result<Bytes, BoxError>> {
    transform(input, Codec::Decode(GzDecoder::new(Vec::new())))
}

/// Encode a body as gzip as it streams, flushing after every chunk.
pub fn gzip<E: Into<BoxError> + Send + 'static>(
    input: BoxStream<'static, Result<Bytes, E>>,
) -> BoxStream<'static, Result<Bytes, BoxError>> {
    transform(
        input,
        Codec::Encode(GzEncoder::new(Vec::new(), Compression::fast())),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn round_trip_in_small_chunks() {
        let text: Vec<u8> = (0..20_000u32)
            .flat_map(|i| i.to_string().into_bytes())
            .collect();
        let chunks: Vec<Result<Bytes, BoxError>> = text
            .chunks(777)
            .map(|c| Ok(Bytes::copy_from_slice(c)))
            .collect();
        let zipped: Vec<u8> = gzip(futures_util::stream::iter(chunks).boxed())
            .map(|r| r.unwrap())
            .collect::<Vec<_>>()
            .await
            .concat();
        let pieces: Vec<Result<Bytes, BoxError>> = zipped
            .chunks(13)
            .map(|c| Ok(Bytes::copy_from_slice(c)))
            .collect();
        let back: Vec<u8> = gunzip(futures_util::stream::iter(pieces).boxed())
            .map(|r| r.unwrap())
            .collect::<Vec<_>>()
            .await
            .concat();
        assert_eq!(back, text);
    }

    #[tokio::test]
    async fn corrupt_gzip_is_an_error_not_a_panic() {
        let bad: Vec<Result<Bytes, BoxError>> =
            vec![Ok(Bytes::from_static(b"\x1f\x8bnot gzip at all"))];
        let out: Vec<_> = gunzip(futures_util::stream::iter(bad).boxed())
            .collect()
            .await;
        assert!(out.iter().any(|r| r.is_err()));
    }

    #[tokio::test]
    async fn a_gzip_bomb_in_one_chunk_is_decoded_in_bounded_pieces() {
        // 64 MiB of zeros compress to about 64 KiB, delivered as one chunk
        // (as a cached template is).
        let mut e = GzEncoder::new(Vec::new(), Compression::best());
        let zeros = vec![0u8; 1 << 20];
        for _ in 0..64 {
            e.write_all(&zeros).unwrap();
        }
        let bomb = Bytes::from(e.finish().unwrap());
        assert!(bomb.len() < 256 * 1024, "{}", bomb.len());
        let input: Vec<Result<Bytes, BoxError>> = vec![Ok(bomb)];
        let mut out = gunzip(futures_util::stream::iter(input).boxed());
        let (mut total, mut largest) = (0usize, 0usize);
        while let Some(piece) = out.next().await {
            let n = piece.unwrap().len();
            total += n;
            largest = largest.max(n);
        }
        assert_eq!(total, 64 << 20);
        // At most 1032:1 per step, plus the decoder's 32 KiB output buffer.
        assert!(
            largest <= 1032 * DECODE_STEP + 64 * 1024,
            "a piece of {largest} bytes"
        );
    }
}
