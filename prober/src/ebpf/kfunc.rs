//! Kernel function (kfunc) calls for an eBPF object that the loader
//! cannot resolve itself: aya resolves no kfuncs, so the program calls
//! each through a placeholder helper number (`call imm`, see
//! `xdp_common::flows::KFUNCS`), and [`patch_calls`] turns every such
//! instruction of the object's code sections into a kfunc call
//! (`src_reg = BPF_PSEUDO_KFUNC_CALL`, `imm` = the function's id in the
//! running kernel's BTF, `off` = 0: vmlinux) before the bytes go to aya.
//!
//! Pure over the object's bytes (ELF64, little endian); the ids come from
//! [`ids_in`] the kernel's BTF ([`vmlinux`]).

use anyhow::{Context, Result, bail};

/// `BPF_JMP | BPF_CALL`.
const OP_CALL: u8 = 0x85;
/// `src_reg` of a call to a kernel function (uapi/linux/bpf.h).
const PSEUDO_KFUNC_CALL: u8 = 2;
/// `SHF_EXECINSTR`: a section of code.
const SHF_EXECINSTR: u64 = 0x4;

/// One section's place in the file.
struct Section {
    flags: u64,
    offset: usize,
    size: usize,
}

/// The section headers of an ELF64 little-endian object.
fn sections(elf: &[u8]) -> Result<Vec<Section>> {
    let u16_at = |o: usize| elf.get(o..o + 2).map(|b| u16::from_le_bytes([b[0], b[1]]));
    let u64_at = |o: usize| {
        elf.get(o..o + 8)
            .map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")))
    };
    if elf.get(..6) != Some(&[0x7f, b'E', b'L', b'F', 2, 1]) {
        bail!("not an ELF64 little-endian object");
    }
    let (Some(shoff), Some(shentsize), Some(shnum)) = (u64_at(0x28), u16_at(0x3a), u16_at(0x3c))
    else {
        bail!("the ELF header is cut short");
    };
    (0..shnum as usize)
        .map(|i| {
            let h = shoff as usize + i * shentsize as usize;
            match (u64_at(h + 0x08), u64_at(h + 0x18), u64_at(h + 0x20)) {
                (Some(flags), Some(offset), Some(size)) => Ok(Section {
                    flags,
                    offset: offset as usize,
                    size: size as usize,
                }),
                _ => bail!("section header {i} lies outside the object"),
            }
        })
        .collect()
}

/// Turns each placeholder call `(number, btf_id)` in the code sections of
/// `elf` into a call of that kernel function. Returns how many calls of
/// each placeholder it patched, in the order given.
pub(crate) fn patch_calls(elf: &mut [u8], kfuncs: &[(u32, u32)]) -> Result<Vec<usize>> {
    let mut patched = vec![0; kfuncs.len()];
    for s in sections(elf)?
        .iter()
        .filter(|s| s.flags & SHF_EXECINSTR != 0)
    {
        let code = elf
            .get_mut(s.offset..s.offset + s.size)
            .context("a code section lies outside the object")?;
        for ins in code.as_chunks_mut::<8>().0 {
            if ins[0] != OP_CALL || ins[1] != 0 {
                continue;
            }
            let imm = u32::from_le_bytes([ins[4], ins[5], ins[6], ins[7]]);
            if let Some(k) = kfuncs.iter().position(|&(number, _)| number == imm) {
                ins[1] = PSEUDO_KFUNC_CALL << 4;
                ins[2..4].copy_from_slice(&0u16.to_le_bytes());
                ins[4..8].copy_from_slice(&kfuncs[k].1.to_le_bytes());
                patched[k] += 1;
            }
        }
    }
    Ok(patched)
}

/// The running kernel's BTF (/sys/kernel/btf/vmlinux).
pub(crate) fn vmlinux() -> Result<aya::Btf> {
    aya::Btf::from_sys_fs()
        .context("read the kernel's BTF (/sys/kernel/btf/vmlinux; CONFIG_DEBUG_INFO_BTF)")
}

/// The BTF ids of `names` among the kernel's functions in `btf`, each None
/// where this kernel has no such function.
pub(crate) fn ids_in(btf: &aya::Btf, names: &[&str]) -> Vec<Option<u32>> {
    names
        .iter()
        .map(|n| {
            btf.id_by_type_name_kind(n, aya_obj::btf::BtfKind::Func)
                .ok()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A minimal ELF64 object: one code section holding `code`, one data
    /// section holding `data`.
    fn object(code: &[u8], data: &[u8]) -> Vec<u8> {
        let mut elf = vec![0u8; 64];
        elf[..6].copy_from_slice(&[0x7f, b'E', b'L', b'F', 2, 1]);
        let code_off = elf.len();
        elf.extend_from_slice(code);
        let data_off = elf.len();
        elf.extend_from_slice(data);
        let shoff = elf.len();
        elf[0x28..0x30].copy_from_slice(&(shoff as u64).to_le_bytes());
        elf[0x3a..0x3c].copy_from_slice(&64u16.to_le_bytes());
        elf[0x3c..0x3e].copy_from_slice(&2u16.to_le_bytes());
        for (flags, off, size) in [
            (SHF_EXECINSTR | 0x2, code_off, code.len()),
            (0x2, data_off, data.len()),
        ] {
            let mut h = vec![0u8; 64];
            h[0x08..0x10].copy_from_slice(&flags.to_le_bytes());
            h[0x18..0x20].copy_from_slice(&(off as u64).to_le_bytes());
            h[0x20..0x28].copy_from_slice(&(size as u64).to_le_bytes());
            elf.extend_from_slice(&h);
        }
        elf
    }

    fn call(imm: u32) -> [u8; 8] {
        let mut i = [OP_CALL, 0, 0, 0, 0, 0, 0, 0];
        i[4..].copy_from_slice(&imm.to_le_bytes());
        i
    }

    #[test]
    fn placeholder_calls_in_code_become_kfunc_calls_and_nothing_else_changes() {
        let helper = call(46);
        let mov = [0xb7, 0x01, 0, 0, 0x01, 0x00, 0xad, 0x7e];
        let code: Vec<u8> = [
            call(0x7ead_0001),
            helper,
            mov,
            call(0x7ead_0002),
            call(0x7ead_0001),
        ]
        .concat();
        // The same bytes as data: never touched.
        let data = call(0x7ead_0001);
        let mut elf = object(&code, &data);
        let before = elf.clone();
        let n = patch_calls(&mut elf, &[(0x7ead_0001, 111), (0x7ead_0002, 222)]).unwrap();
        assert_eq!(n, [2, 1]);
        let at = |i: usize| &elf[64 + i * 8..64 + i * 8 + 8];
        assert_eq!(at(0), [OP_CALL, 0x20, 0, 0, 111, 0, 0, 0]);
        assert_eq!(at(1), helper, "a helper call stays");
        assert_eq!(at(2), mov, "an instruction that is no call stays");
        assert_eq!(at(3), [OP_CALL, 0x20, 0, 0, 222, 0, 0, 0]);
        assert_eq!(at(4), [OP_CALL, 0x20, 0, 0, 111, 0, 0, 0]);
        let data_at = 64 + code.len();
        assert_eq!(elf[data_at..data_at + 8], before[data_at..data_at + 8]);
    }

    #[test]
    fn what_is_not_an_elf64_object_is_refused() {
        assert!(patch_calls(&mut [0u8; 10], &[]).is_err());
        let mut cut = object(&call(1), &[]);
        cut.truncate(100);
        assert!(
            patch_calls(&mut cut, &[]).is_err(),
            "section headers cut off"
        );
    }

    #[test]
    #[ignore = "needs root: run by cargo xtask test"]
    fn this_kernel_names_the_tx_timestamping_kfuncs() {
        let names: Vec<&str> = xdp_common::flows::KFUNCS.iter().map(|k| k.1).collect();
        let ids = ids_in(&vmlinux().unwrap(), &names);
        assert!(ids.iter().all(Option::is_some), "{names:?}: {ids:?}");
    }
}
