//! A minimal PNG encoder: 4-bit palette images, zlib with stored (uncompressed) deflate blocks.
//!
//! The vision workload's pictures are noise, which deflate cannot shrink, so storing the rows
//! as they are loses nothing in size and keeps the encoder a few dozen lines with no
//! dependency. It also keeps the bytes fixed forever: an image's identity is the blake3 of its
//! bytes (`kvmesh_protocol::hashing::MediaId`), so a compressor whose output changed between
//! versions would change every simulated run (the reason `crate::rng` is ours too).
//!
//! Format: the signature, `IHDR` (bit depth 4, colour type 3), `PLTE`, one `IDAT` holding a
//! zlib stream (header `78 01`, stored blocks of at most 65,535 bytes, Adler-32), `IEND`. Each
//! row is filter byte 0 then the row's packed indices, two pixels a byte, high nibble first.

/// Bits per pixel (4: 16 palette entries).
pub const BIT_DEPTH: u8 = 4;

/// Palette entries of a 4-bit image.
pub const PALETTE_LEN: usize = 16;

/// Largest stored deflate block.
const STORED_BLOCK: usize = 65_535;

/// Bytes of one row's packed indices (without its filter byte).
pub fn row_bytes(width: u32) -> usize {
    (width as usize).div_ceil(2)
}

/// A 4-bit palette PNG of `width` × `height` pixels; `rows` fills each row's packed indices
/// (`row_bytes(width)` bytes, row by row from the top). Width and height must be positive.
pub fn encode(
    width: u32,
    height: u32,
    palette: &[[u8; 3]; PALETTE_LEN],
    mut rows: impl FnMut(u32, &mut [u8]),
) -> Vec<u8> {
    assert!(width > 0 && height > 0, "a PNG has at least one pixel");
    let stride = 1 + row_bytes(width);
    let raw_len = stride * height as usize;
    let mut raw = vec![0u8; raw_len];
    for (y, row) in raw.chunks_exact_mut(stride).enumerate() {
        row[0] = 0; // filter: none
        rows(y as u32, &mut row[1..]);
    }
    let blocks = raw_len.div_ceil(STORED_BLOCK).max(1);
    let mut zlib = Vec::with_capacity(2 + raw_len + 5 * blocks + 4);
    zlib.extend_from_slice(&[0x78, 0x01]);
    let mut chunks = raw.chunks(STORED_BLOCK).peekable();
    while let Some(block) = chunks.next() {
        let last = chunks.peek().is_none();
        let len = block.len() as u16;
        zlib.push(u8::from(last)); // BFINAL, BTYPE 00 (stored)
        zlib.extend_from_slice(&len.to_le_bytes());
        zlib.extend_from_slice(&(!len).to_le_bytes());
        zlib.extend_from_slice(block);
    }
    zlib.extend_from_slice(&adler32(&raw).to_be_bytes());

    let mut png = Vec::with_capacity(8 + 25 + 12 + 3 * PALETTE_LEN + 12 + zlib.len() + 12);
    png.extend_from_slice(b"\x89PNG\r\n\x1a\n");
    let mut ihdr = [0u8; 13];
    ihdr[..4].copy_from_slice(&width.to_be_bytes());
    ihdr[4..8].copy_from_slice(&height.to_be_bytes());
    // Bit depth, colour type 3 (palette), compression 0, filter 0, no interlace.
    ihdr[8..].copy_from_slice(&[BIT_DEPTH, 3, 0, 0, 0]);
    chunk(&mut png, b"IHDR", &ihdr);
    chunk(&mut png, b"PLTE", palette.as_flattened());
    chunk(&mut png, b"IDAT", &zlib);
    chunk(&mut png, b"IEND", &[]);
    png
}

/// Appends one chunk: length, type, data, CRC-32 of type and data.
fn chunk(out: &mut Vec<u8>, kind: &[u8; 4], data: &[u8]) {
    out.extend_from_slice(&(data.len() as u32).to_be_bytes());
    let start = out.len();
    out.extend_from_slice(kind);
    out.extend_from_slice(data);
    let crc = crc32(&out[start..]);
    out.extend_from_slice(&crc.to_be_bytes());
}

/// CRC-32 (ISO-HDLC, reflected polynomial 0xEDB88320), as PNG chunks use it.
pub fn crc32(bytes: &[u8]) -> u32 {
    const TABLE: [u32; 256] = {
        let mut table = [0u32; 256];
        let mut n = 0;
        while n < 256 {
            let mut c = n as u32;
            let mut k = 0;
            while k < 8 {
                c = if c & 1 == 1 {
                    0xedb8_8320 ^ (c >> 1)
                } else {
                    c >> 1
                };
                k += 1;
            }
            table[n] = c;
            n += 1;
        }
        table
    };
    !bytes.iter().fold(!0u32, |c, &b| {
        TABLE[((c ^ u32::from(b)) & 0xff) as usize] ^ (c >> 8)
    })
}

/// Adler-32, the zlib stream's checksum.
pub fn adler32(bytes: &[u8]) -> u32 {
    const MOD: u32 = 65_521;
    let (mut a, mut b) = (1u32, 0u32);
    // 5,552 bytes is the most that cannot overflow `b` before the modulo.
    for block in bytes.chunks(5_552) {
        for &x in block {
            a += u32::from(x);
            b += a;
        }
        a %= MOD;
        b %= MOD;
    }
    (b << 16) | a
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checksums_match_their_reference_values() {
        // The check values of the CRC catalogue and of zlib's documentation.
        assert_eq!(crc32(b"123456789"), 0xcbf4_3926);
        assert_eq!(crc32(b"IEND"), 0xae42_6082);
        assert_eq!(adler32(b"Wikipedia"), 0x11e6_0398);
        assert_eq!(adler32(&[0xff; 100_000]), {
            let (mut a, mut b) = (1u64, 0u64);
            for _ in 0..100_000 {
                a = (a + 0xff) % 65_521;
                b = (b + a) % 65_521;
            }
            ((b << 16) | a) as u32
        });
    }

    #[test]
    fn a_png_decoder_reads_every_pixel_back() {
        let palette: [[u8; 3]; PALETTE_LEN] =
            std::array::from_fn(|i| [i as u8 * 16, 255 - i as u8 * 16, i as u8]);
        // 301 wide: an odd width (a half-used last byte); 400 rows span several stored blocks.
        let (width, height) = (301u32, 400u32);
        let index = |x: u32, y: u32| ((x * 7 + y * 3) % 16) as u8;
        let png = encode(width, height, &palette, |y, row| {
            row.fill(0);
            for x in 0..width {
                row[x as usize / 2] |= index(x, y) << if x % 2 == 0 { 4 } else { 0 };
            }
        });
        let mut decoder = ::png::Decoder::new(std::io::Cursor::new(&png));
        decoder.set_transformations(::png::Transformations::IDENTITY);
        let mut reader = decoder.read_info().expect("a valid header");
        let info = reader.info();
        assert_eq!((info.width, info.height), (width, height));
        assert_eq!(info.color_type, ::png::ColorType::Indexed);
        assert_eq!(info.bit_depth, ::png::BitDepth::Four);
        assert_eq!(info.palette.as_deref(), Some(palette.as_flattened()));
        let mut pixels = vec![0; reader.output_buffer_size().expect("a sane size")];
        let frame = reader.next_frame(&mut pixels).expect("valid image data");
        let stride = frame.line_size;
        for y in 0..height {
            for x in 0..width {
                let byte = pixels[y as usize * stride + x as usize / 2];
                let got = if x % 2 == 0 { byte >> 4 } else { byte & 15 };
                assert_eq!(got, index(x, y), "pixel ({x}, {y})");
            }
        }
    }
}
