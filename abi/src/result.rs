//! Result codes of the CUDA driver API (`CUresult`) and NVML (`nvmlReturn_t`).
//!
//! One list per enum, from `cuda.h` / `nvml.h` (CUDA 12.9 wheels; the numbers are ABI and never
//! change): `status_codes!` turns it into the constants, the name table and the lookups.
//! `abi/gen/pfn.py` refuses to run while these lists differ from the headers' enums.

#![allow(missing_docs)] // the names are the documentation: they are the enumerators of cuda.h / nvml.h

use core::ffi::CStr;

/// A CUDA driver API status code.
pub type CUresult = u32;
/// An NVML status code.
pub type NvmlReturn = u32;

/// One constant per `NAME = value` row, a table of `(value, "NAME")` in list order, and the
/// lookups by value (Rust and NUL-terminated names) and by name.
macro_rules! status_codes {
    (
        $ty:ident, $table:ident, $name_fn:ident, $cname_fn:ident, $from_fn:ident, $what:literal,
        { $($name:ident = $value:literal,)* }
    ) => {
        $( pub const $name: $ty = $value; )*

        #[doc = concat!("Every ", $what, " and its enum name, in the header's order.")]
        pub const $table: &[($ty, &str)] = &[$(($name, stringify!($name))),*];

        #[doc = concat!("The enum name of a ", $what, " (`", stringify!($table), "`), if it is one.")]
        pub fn $name_fn(code: $ty) -> Option<&'static str> {
            Some(match code {
                $( $name => stringify!($name), )*
                _ => return None,
            })
        }

        #[doc = concat!("The enum name of a ", $what, " as a C string, for APIs that return one.")]
        pub fn $cname_fn(code: $ty) -> Option<&'static CStr> {
            let s: &'static str = match code {
                $( $name => concat!(stringify!($name), "\0"), )*
                _ => return None,
            };
            CStr::from_bytes_with_nul(s.as_bytes()).ok()
        }

        #[doc = concat!("The ", $what, " called `name`, if there is one.")]
        pub fn $from_fn(name: &str) -> Option<$ty> {
            Some(match name {
                $( stringify!($name) => $name, )*
                _ => return None,
            })
        }
    };
}

status_codes! {
    CUresult, CU_RESULT_NAMES, cu_result_name, cu_result_cname, cu_result_from_name,
    "driver status code",
    {
        CUDA_SUCCESS = 0,
        CUDA_ERROR_INVALID_VALUE = 1,
        CUDA_ERROR_OUT_OF_MEMORY = 2,
        CUDA_ERROR_NOT_INITIALIZED = 3,
        CUDA_ERROR_DEINITIALIZED = 4,
        CUDA_ERROR_PROFILER_DISABLED = 5,
        CUDA_ERROR_PROFILER_NOT_INITIALIZED = 6,
        CUDA_ERROR_PROFILER_ALREADY_STARTED = 7,
        CUDA_ERROR_PROFILER_ALREADY_STOPPED = 8,
        CUDA_ERROR_STUB_LIBRARY = 34,
        CUDA_ERROR_DEVICE_UNAVAILABLE = 46,
        CUDA_ERROR_NO_DEVICE = 100,
        CUDA_ERROR_INVALID_DEVICE = 101,
        CUDA_ERROR_DEVICE_NOT_LICENSED = 102,
        CUDA_ERROR_INVALID_IMAGE = 200,
        CUDA_ERROR_INVALID_CONTEXT = 201,
        CUDA_ERROR_CONTEXT_ALREADY_CURRENT = 202,
        CUDA_ERROR_MAP_FAILED = 205,
        CUDA_ERROR_UNMAP_FAILED = 206,
        CUDA_ERROR_ARRAY_IS_MAPPED = 207,
        CUDA_ERROR_ALREADY_MAPPED = 208,
        CUDA_ERROR_NO_BINARY_FOR_GPU = 209,
        CUDA_ERROR_ALREADY_ACQUIRED = 210,
        CUDA_ERROR_NOT_MAPPED = 211,
        CUDA_ERROR_NOT_MAPPED_AS_ARRAY = 212,
        CUDA_ERROR_NOT_MAPPED_AS_POINTER = 213,
        CUDA_ERROR_ECC_UNCORRECTABLE = 214,
        CUDA_ERROR_UNSUPPORTED_LIMIT = 215,
        CUDA_ERROR_CONTEXT_ALREADY_IN_USE = 216,
        CUDA_ERROR_PEER_ACCESS_UNSUPPORTED = 217,
        CUDA_ERROR_INVALID_PTX = 218,
        CUDA_ERROR_INVALID_GRAPHICS_CONTEXT = 219,
        CUDA_ERROR_NVLINK_UNCORRECTABLE = 220,
        CUDA_ERROR_JIT_COMPILER_NOT_FOUND = 221,
        CUDA_ERROR_UNSUPPORTED_PTX_VERSION = 222,
        CUDA_ERROR_JIT_COMPILATION_DISABLED = 223,
        CUDA_ERROR_UNSUPPORTED_EXEC_AFFINITY = 224,
        CUDA_ERROR_UNSUPPORTED_DEVSIDE_SYNC = 225,
        CUDA_ERROR_CONTAINED = 226,
        CUDA_ERROR_INVALID_SOURCE = 300,
        CUDA_ERROR_FILE_NOT_FOUND = 301,
        CUDA_ERROR_SHARED_OBJECT_SYMBOL_NOT_FOUND = 302,
        CUDA_ERROR_SHARED_OBJECT_INIT_FAILED = 303,
        CUDA_ERROR_OPERATING_SYSTEM = 304,
        CUDA_ERROR_INVALID_HANDLE = 400,
        CUDA_ERROR_ILLEGAL_STATE = 401,
        CUDA_ERROR_LOSSY_QUERY = 402,
        CUDA_ERROR_NOT_FOUND = 500,
        CUDA_ERROR_NOT_READY = 600,
        CUDA_ERROR_ILLEGAL_ADDRESS = 700,
        CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES = 701,
        CUDA_ERROR_LAUNCH_TIMEOUT = 702,
        CUDA_ERROR_LAUNCH_INCOMPATIBLE_TEXTURING = 703,
        CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED = 704,
        CUDA_ERROR_PEER_ACCESS_NOT_ENABLED = 705,
        CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE = 708,
        CUDA_ERROR_CONTEXT_IS_DESTROYED = 709,
        CUDA_ERROR_ASSERT = 710,
        CUDA_ERROR_TOO_MANY_PEERS = 711,
        CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED = 712,
        CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED = 713,
        CUDA_ERROR_HARDWARE_STACK_ERROR = 714,
        CUDA_ERROR_ILLEGAL_INSTRUCTION = 715,
        CUDA_ERROR_MISALIGNED_ADDRESS = 716,
        CUDA_ERROR_INVALID_ADDRESS_SPACE = 717,
        CUDA_ERROR_INVALID_PC = 718,
        CUDA_ERROR_LAUNCH_FAILED = 719,
        CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE = 720,
        CUDA_ERROR_TENSOR_MEMORY_LEAK = 721,
        CUDA_ERROR_NOT_PERMITTED = 800,
        CUDA_ERROR_NOT_SUPPORTED = 801,
        CUDA_ERROR_SYSTEM_NOT_READY = 802,
        CUDA_ERROR_SYSTEM_DRIVER_MISMATCH = 803,
        CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE = 804,
        CUDA_ERROR_MPS_CONNECTION_FAILED = 805,
        CUDA_ERROR_MPS_RPC_FAILURE = 806,
        CUDA_ERROR_MPS_SERVER_NOT_READY = 807,
        CUDA_ERROR_MPS_MAX_CLIENTS_REACHED = 808,
        CUDA_ERROR_MPS_MAX_CONNECTIONS_REACHED = 809,
        CUDA_ERROR_MPS_CLIENT_TERMINATED = 810,
        CUDA_ERROR_CDP_NOT_SUPPORTED = 811,
        CUDA_ERROR_CDP_VERSION_MISMATCH = 812,
        CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED = 900,
        CUDA_ERROR_STREAM_CAPTURE_INVALIDATED = 901,
        CUDA_ERROR_STREAM_CAPTURE_MERGE = 902,
        CUDA_ERROR_STREAM_CAPTURE_UNMATCHED = 903,
        CUDA_ERROR_STREAM_CAPTURE_UNJOINED = 904,
        CUDA_ERROR_STREAM_CAPTURE_ISOLATION = 905,
        CUDA_ERROR_STREAM_CAPTURE_IMPLICIT = 906,
        CUDA_ERROR_CAPTURED_EVENT = 907,
        CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD = 908,
        CUDA_ERROR_TIMEOUT = 909,
        CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE = 910,
        CUDA_ERROR_EXTERNAL_DEVICE = 911,
        CUDA_ERROR_INVALID_CLUSTER_SIZE = 912,
        CUDA_ERROR_FUNCTION_NOT_LOADED = 913,
        CUDA_ERROR_INVALID_RESOURCE_TYPE = 914,
        CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION = 915,
        CUDA_ERROR_KEY_ROTATION = 916,
        CUDA_ERROR_UNKNOWN = 999,
    }
}

status_codes! {
    NvmlReturn, NVML_RETURN_NAMES, nvml_return_name, nvml_return_cname, nvml_return_from_name,
    "NVML status code",
    {
        NVML_SUCCESS = 0,
        NVML_ERROR_UNINITIALIZED = 1,
        NVML_ERROR_INVALID_ARGUMENT = 2,
        NVML_ERROR_NOT_SUPPORTED = 3,
        NVML_ERROR_NO_PERMISSION = 4,
        NVML_ERROR_ALREADY_INITIALIZED = 5,
        NVML_ERROR_NOT_FOUND = 6,
        NVML_ERROR_INSUFFICIENT_SIZE = 7,
        NVML_ERROR_INSUFFICIENT_POWER = 8,
        NVML_ERROR_DRIVER_NOT_LOADED = 9,
        NVML_ERROR_TIMEOUT = 10,
        NVML_ERROR_IRQ_ISSUE = 11,
        NVML_ERROR_LIBRARY_NOT_FOUND = 12,
        NVML_ERROR_FUNCTION_NOT_FOUND = 13,
        NVML_ERROR_CORRUPTED_INFOROM = 14,
        NVML_ERROR_GPU_IS_LOST = 15,
        NVML_ERROR_RESET_REQUIRED = 16,
        NVML_ERROR_OPERATING_SYSTEM = 17,
        NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18,
        NVML_ERROR_IN_USE = 19,
        NVML_ERROR_MEMORY = 20,
        NVML_ERROR_NO_DATA = 21,
        NVML_ERROR_VGPU_ECC_NOT_SUPPORTED = 22,
        NVML_ERROR_INSUFFICIENT_RESOURCES = 23,
        NVML_ERROR_FREQ_NOT_SUPPORTED = 24,
        NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25,
        NVML_ERROR_DEPRECATED = 26,
        NVML_ERROR_NOT_READY = 27,
        NVML_ERROR_GPU_NOT_FOUND = 28,
        NVML_ERROR_INVALID_STATE = 29,
        NVML_ERROR_UNKNOWN = 999,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trip(
        table: &[(u32, &str)],
        name: fn(u32) -> Option<&'static str>,
        cname: fn(u32) -> Option<&'static CStr>,
        from: fn(&str) -> Option<u32>,
    ) {
        for &(code, n) in table {
            assert_eq!(name(code), Some(n), "{code}");
            assert_eq!(cname(code).and_then(|c| c.to_str().ok()), Some(n), "{code}");
            assert_eq!(from(n), Some(code), "{n}");
        }
        // one name per code and one code per name, in increasing order as in the headers
        assert!(
            table.windows(2).all(|w| w[0].0 < w[1].0),
            "codes out of order or repeated"
        );
        let mut names: Vec<&str> = table.iter().map(|t| t.1).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), table.len(), "a name is repeated");
        // a value between two codes, or past the last, is no code
        for code in 0..=1000 {
            let known = table.iter().any(|t| t.0 == code);
            assert_eq!(name(code).is_some(), known, "{code}");
            assert_eq!(cname(code).is_some(), known, "{code}");
        }
        assert_eq!(from("CUDA_ERROR_NOT_A_CODE"), None);
        assert_eq!(from(""), None);
    }

    #[test]
    fn every_driver_code_maps_to_its_name_and_back() {
        round_trip(
            CU_RESULT_NAMES,
            cu_result_name,
            cu_result_cname,
            cu_result_from_name,
        );
        assert_eq!(CU_RESULT_NAMES.len(), 100);
        assert_eq!(
            cu_result_name(CUDA_ERROR_OUT_OF_MEMORY),
            Some("CUDA_ERROR_OUT_OF_MEMORY")
        );
        assert_eq!(CUDA_ERROR_OUT_OF_MEMORY, 2);
        assert_eq!(cu_result_from_name("CUDA_ERROR_UNKNOWN"), Some(999));
    }

    #[test]
    fn every_nvml_code_maps_to_its_name_and_back() {
        round_trip(
            NVML_RETURN_NAMES,
            nvml_return_name,
            nvml_return_cname,
            nvml_return_from_name,
        );
        assert_eq!(NVML_RETURN_NAMES.len(), 31);
        assert_eq!(
            nvml_return_name(NVML_ERROR_NOT_FOUND),
            Some("NVML_ERROR_NOT_FOUND")
        );
        assert_eq!(NVML_ERROR_NOT_FOUND, 6);
    }
}
