//! Types shared by the XDP router (eBPF side) and rtprobe (user side).
#![no_std]
