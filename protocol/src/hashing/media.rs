//! The identity of an image or audio part: the blake3 of its decoded bytes, or of its URL when
//! only a URL is given. The same picture sent twice hashes the same; a URL is trusted to name
//! the same content each time (a router cannot fetch it on the request path).

use base64::Engine as _;

/// Digest of a media reference: a `data:` URL or raw base64 is decoded first; anything that
/// does not decode (or a plain URL) is identified by its text.
pub fn media_digest(reference: &str) -> [u8; 32] {
    if let Some(payload) = data_url_payload(reference)
        && let Ok(bytes) = base64::engine::general_purpose::STANDARD.decode(payload)
    {
        return *blake3::hash(&bytes).as_bytes();
    }
    *blake3::hash(reference.as_bytes()).as_bytes()
}

/// Digest of media given as bare base64 (e.g. `input_audio.data`).
pub fn base64_media_digest(data: &str) -> [u8; 32] {
    match base64::engine::general_purpose::STANDARD.decode(data.trim()) {
        Ok(bytes) => *blake3::hash(&bytes).as_bytes(),
        Err(_) => *blake3::hash(data.as_bytes()).as_bytes(),
    }
}

fn data_url_payload(url: &str) -> Option<&str> {
    let rest = url.strip_prefix("data:")?;
    let (meta, payload) = rest.split_once(',')?;
    meta.ends_with(";base64").then_some(payload)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn data_url_and_bare_base64_of_the_same_bytes_agree() {
        let b64 = base64::engine::general_purpose::STANDARD.encode(b"\x89PNG fake image");
        let url = format!("data:image/png;base64,{b64}");
        assert_eq!(media_digest(&url), base64_media_digest(&b64));
        assert_eq!(
            media_digest(&url),
            *blake3::hash(b"\x89PNG fake image").as_bytes()
        );
    }

    #[test]
    fn plain_urls_hash_their_text() {
        assert_eq!(
            media_digest("https://example.com/cat.png"),
            *blake3::hash(b"https://example.com/cat.png").as_bytes()
        );
        assert_ne!(
            media_digest("https://a/1.png"),
            media_digest("https://a/2.png")
        );
    }
}
