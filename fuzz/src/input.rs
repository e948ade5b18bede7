//! Splitting one fuzz input into several messages.
//!
//! A target that decodes a sequence of messages (shards applied in order, a stream pushed in
//! chunks) reads them as `[len: u16 big-endian][len bytes]` pieces. The format is trivial on
//! purpose: the seed writer produces it from real encodings, and libFuzzer's mutations of a
//! length or a body both stay meaningful.

/// The pieces of `data`; the last takes whatever is left when its length runs past the end.
pub fn pieces(data: &[u8]) -> impl Iterator<Item = &[u8]> {
    let mut rest = data;
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        let (len, body) = match rest {
            [hi, lo, body @ ..] => (usize::from(u16::from_be_bytes([*hi, *lo])), body),
            // One stray byte: an empty piece, so that it is consumed.
            [_] => (0, &rest[1..]),
            [] => unreachable!("checked above"),
        };
        let take = len.min(body.len());
        let (piece, tail) = body.split_at(take);
        rest = tail;
        Some(piece)
    })
}

/// The inverse of [`pieces`], for seeds.
pub fn join<P: AsRef<[u8]>>(pieces: impl IntoIterator<Item = P>) -> Vec<u8> {
    let mut out = Vec::new();
    for piece in pieces {
        let piece = piece.as_ref();
        let len = u16::try_from(piece.len()).expect("a seed piece fits a u16 length");
        out.extend_from_slice(&len.to_be_bytes());
        out.extend_from_slice(piece);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn join_and_pieces_are_inverse() {
        let parts: [&[u8]; 3] = [b"abc", b"", b"xyzzy"];
        let joined = join(parts);
        assert_eq!(pieces(&joined).collect::<Vec<_>>(), parts);
        // A short last piece takes what is left.
        assert_eq!(pieces(&[0, 9, 1, 2]).collect::<Vec<_>>(), [&[1u8, 2][..]]);
    }
}
