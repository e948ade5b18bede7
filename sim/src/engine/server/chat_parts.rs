//! Content parts of a chat message (OpenAI's shapes, as vLLM accepts them) into what the chat
//! template renders: text, or a media item sized and named by the engine model.
//!
//! Media parts: `{"type":"image_url","image_url":{"url":U}}` (or `"image_url": U`),
//! `{"type":"input_audio","input_audio":{"data":B64,"format":F}}` and
//! `{"type":"video_url","video_url":{"url":U}}`, each with an optional part-level
//! `"uuid": S`, vLLM's caller-supplied identifier of the item. The Responses API's
//! `{"type":"input_image","image_url":U}` is an image too ([`input_image`]).

use serde_json::Value;

use super::errors::ApiError;
use crate::engine::model::chat_prompt::ContentPart;
use crate::engine::model::media::{MediaConfig, MediaPart, MediaSource, Modality};

/// One content part. `base_model` names engine-made identifiers; `media` sizes items.
pub(super) fn content_part(
    part: &Value,
    base_model: &str,
    media: &MediaConfig,
) -> Result<ContentPart, ApiError> {
    let kind = part.get("type").and_then(Value::as_str);
    let (modality, source) = match kind {
        Some("text") => {
            let text = part.get("text").and_then(Value::as_str).unwrap_or("");
            return Ok(ContentPart::Text(text.to_owned()));
        }
        Some("image_url") => (Modality::Image, MediaSource::Url(url(part, "image_url")?)),
        Some("video_url") => (Modality::Video, MediaSource::Url(url(part, "video_url")?)),
        Some("input_audio") => {
            let data = part
                .pointer("/input_audio/data")
                .and_then(Value::as_str)
                .ok_or_else(|| missing("input_audio.data"))?;
            (Modality::Audio, MediaSource::Base64(data.to_owned()))
        }
        _ => {
            return Err(ApiError::bad_param(
                "messages",
                "unsupported content part (expected `text`, `image_url`, `input_audio` or \
                 `video_url`)",
            ));
        }
    };
    media_part(part, modality, source, base_model, media, "messages")
}

/// A Responses API `input_image` part (`image_url` a URL string).
pub(super) fn input_image(
    part: &Value,
    base_model: &str,
    media: &MediaConfig,
) -> Result<ContentPart, ApiError> {
    let url = url(part, "image_url")
        .map_err(|_| ApiError::bad_param("input", "content part without `image_url`".to_owned()))?;
    media_part(
        part,
        Modality::Image,
        MediaSource::Url(url),
        base_model,
        media,
        "input",
    )
}

/// The media item of `part`, named by its `uuid` when it has one. `param` names the request
/// field in errors.
fn media_part(
    part: &Value,
    modality: Modality,
    source: MediaSource,
    base_model: &str,
    media: &MediaConfig,
    param: &str,
) -> Result<ContentPart, ApiError> {
    let uuid = match part.get("uuid") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(s.clone()),
        Some(_) => return Err(ApiError::bad_param(param, "`uuid` must be a string")),
    };
    let part = MediaPart {
        modality,
        source,
        uuid,
    };
    Ok(ContentPart::Media(part.resolve(base_model, media)))
}

/// The URL of a `{key: {"url": U}}` or `{key: U}` part.
fn url(part: &Value, key: &str) -> Result<String, ApiError> {
    let field = part.get(key);
    field
        .and_then(Value::as_str)
        .or_else(|| field?.get("url")?.as_str())
        .map(str::to_owned)
        .ok_or_else(|| missing(&format!("{key}.url")))
}

fn missing(what: &str) -> ApiError {
    ApiError::bad_param("messages", format!("content part without `{what}`"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn media(part: Value) -> crate::engine::model::media::ResolvedMedia {
        match content_part(&part, "m", &MediaConfig::default()).unwrap() {
            ContentPart::Media(m) => m,
            other => panic!("not media: {other:?}"),
        }
    }

    #[test]
    fn every_media_shape_parses() {
        let obj = media(json!({"type":"image_url","image_url":{"url":"https://x/a.png"}}));
        let plain = media(json!({"type":"image_url","image_url":"https://x/a.png"}));
        assert_eq!(obj, plain);
        assert_eq!(obj.modality, Modality::Image);
        let video = media(
            json!({"type":"video_url","video_url":{"url":"https://x/v.mp4"},
            "uuid":"v1"}),
        );
        assert_eq!(
            (video.modality, video.identifier.as_str()),
            (Modality::Video, "v1")
        );
        let audio = media(json!({"type":"input_audio",
            "input_audio":{"data":"AAEC","format":"wav"}}));
        assert_eq!(audio.modality, Modality::Audio);
    }

    #[test]
    fn bad_parts_are_400() {
        for part in [
            json!({"type":"file","file":{}}),
            json!({"type":"image_url"}),
            json!({"type":"input_audio","input_audio":{}}),
            json!({"type":"image_url","image_url":"u","uuid":7}),
        ] {
            let e = content_part(&part, "m", &MediaConfig::default()).unwrap_err();
            assert_eq!(e.status, 400, "{part}");
        }
    }
}
