//! MD2 (RFC 1319) and HMAC-MD2 (RFC 2104 with MD2's 16-byte block), which the integrity check
//! answers with. Apart because it is a hash of our own, with no state and no CUDA in it, tested
//! against the RFC's test suite.

/// The MD2 S-box: a permutation of 0..255 built from the digits of pi (RFC 1319).
const PI_SUBST: [u8; 256] = [
    41, 46, 67, 201, 162, 216, 124, 1, 61, 54, 84, 161, 236, 240, 6, 19, 98, 167, 5, 243, 192, 199,
    115, 140, 152, 147, 43, 217, 188, 76, 130, 202, 30, 155, 87, 60, 253, 212, 224, 22, 103, 66,
    111, 24, 138, 23, 229, 18, 190, 78, 196, 214, 218, 158, 222, 73, 160, 251, 245, 142, 187, 47,
    238, 122, 169, 104, 121, 145, 21, 178, 7, 63, 148, 194, 16, 137, 11, 34, 95, 33, 128, 127, 93,
    154, 90, 144, 50, 39, 53, 62, 204, 231, 191, 247, 151, 3, 255, 25, 48, 179, 72, 165, 181, 209,
    215, 94, 146, 42, 172, 86, 170, 198, 79, 184, 56, 210, 150, 164, 125, 182, 118, 252, 107, 226,
    156, 116, 4, 241, 69, 157, 112, 89, 100, 113, 135, 32, 134, 91, 207, 101, 230, 45, 168, 2, 27,
    96, 37, 173, 174, 176, 185, 246, 28, 70, 97, 105, 52, 64, 126, 15, 85, 71, 163, 35, 221, 81,
    175, 58, 195, 92, 249, 206, 186, 197, 234, 38, 44, 83, 13, 110, 133, 40, 132, 9, 211, 223, 205,
    244, 65, 129, 77, 82, 106, 220, 55, 200, 108, 193, 171, 250, 36, 225, 123, 8, 12, 189, 177, 74,
    120, 136, 149, 139, 227, 99, 232, 109, 233, 203, 213, 254, 59, 0, 29, 57, 242, 239, 183, 14,
    102, 88, 208, 228, 166, 119, 114, 248, 235, 117, 75, 10, 49, 68, 80, 180, 143, 237, 31, 26,
    219, 153, 141, 51, 159, 17, 131, 20,
];

/// MD2 of `data` (RFC 1319).
pub fn md2(data: &[u8]) -> [u8; 16] {
    let pad = 16 - data.len() % 16;
    let mut msg = Vec::with_capacity(data.len() + pad + 16);
    msg.extend_from_slice(data);
    msg.extend(std::iter::repeat_n(pad as u8, pad));
    // The checksum block.
    let mut c = [0u8; 16];
    let mut l = 0u8;
    for block in msg.chunks_exact(16) {
        for j in 0..16 {
            c[j] ^= PI_SUBST[(block[j] ^ l) as usize];
            l = c[j];
        }
    }
    msg.extend_from_slice(&c);
    let mut x = [0u8; 48];
    for block in msg.chunks_exact(16) {
        for j in 0..16 {
            x[16 + j] = block[j];
            x[32 + j] = x[16 + j] ^ x[j];
        }
        let mut t = 0u8;
        for j in 0..18u8 {
            for b in x.iter_mut() {
                *b ^= PI_SUBST[t as usize];
                t = *b;
            }
            t = t.wrapping_add(j);
        }
    }
    x[..16].try_into().unwrap_or_default()
}

/// HMAC-MD2 (RFC 2104 with MD2's 16-byte block).
pub fn hmac_md2(key: &[u8], msg: &[u8]) -> [u8; 16] {
    let mut k = [0u8; 16];
    if key.len() > 16 {
        k = md2(key);
    } else {
        k[..key.len()].copy_from_slice(key);
    }
    let mut inner = Vec::with_capacity(16 + msg.len());
    inner.extend(k.iter().map(|b| b ^ 0x36));
    inner.extend_from_slice(msg);
    let ih = md2(&inner);
    let mut outer = Vec::with_capacity(32);
    outer.extend(k.iter().map(|b| b ^ 0x5c));
    outer.extend_from_slice(&ih);
    md2(&outer)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(d: [u8; 16]) -> String {
        d.iter().map(|b| format!("{b:02x}")).collect()
    }

    #[test]
    fn md2_rfc1319_test_suite() {
        let cases = [
            ("", "8350e5a3e24c153df2275c9f80692773"),
            ("a", "32ec01ec4a6dac72c0ab96fb34c0b5d1"),
            ("abc", "da853b0d3f88d99b30283a69e6ded6bb"),
            ("message digest", "ab4f496bfb2a530b219ff33031fe06b0"),
            (
                "abcdefghijklmnopqrstuvwxyz",
                "4e8ddff3650292ab5a4108c3aa47940b",
            ),
            (
                "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789",
                "da33def2a42df13975352846c30338cd",
            ),
            (
                "12345678901234567890123456789012345678901234567890123456789012345678901234567890",
                "d5976f79d83d3a0dc9806c3c66f3efd8",
            ),
        ];
        for (msg, want) in cases {
            assert_eq!(h(md2(msg.as_bytes())), want, "MD2({msg:?})");
        }
    }

    #[test]
    fn hmac_md2_is_rfc2104_over_md2() {
        // HMAC's definition with a 16-byte key (the block size): H((K^opad) || H((K^ipad) || m)).
        let key = *b"sixteen byte key";
        let msg = b"what the runtime sends";
        let mut inner: Vec<u8> = key.iter().map(|b| b ^ 0x36).collect();
        inner.extend_from_slice(msg);
        let mut outer: Vec<u8> = key.iter().map(|b| b ^ 0x5c).collect();
        outer.extend_from_slice(&md2(&inner));
        assert_eq!(hmac_md2(&key, msg), md2(&outer));
        // A different key or message changes the answer.
        assert_ne!(
            hmac_md2(&key, msg),
            hmac_md2(&key, b"what the runtime sent")
        );
        assert_ne!(hmac_md2(&[0; 16], msg), hmac_md2(&key, msg));
        // A key longer than the block is hashed first.
        let long = [7u8; 40];
        assert_eq!(hmac_md2(&long, msg), hmac_md2(&md2(&long), msg));
    }
}
