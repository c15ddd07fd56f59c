/// Calls the macro `$m` (in scope where this is invoked) with every driver and NVML
/// entry point the interception library hooks, by exported name, in table order: one
/// list for the interception library's table (`tessera-interpose`'s
/// `loader/hook_table.rs` and `hooks/mod.rs`) and the front's jump stubs
/// (`tessera-front`); `cuda/tests/front.rs` checks that the built libraries export the
/// same names.
#[macro_export]
macro_rules! for_each_hook {
    ($m:ident) => {
        $m!(
            cuGetProcAddress,
            cuGetProcAddress_v2,
            cuInit,
            cuMemAlloc_v2,
            cuMemAllocPitch_v2,
            cuMemAllocManaged,
            cuMemFree_v2,
            cuMemAllocAsync,
            cuMemAllocAsync_ptsz,
            cuMemAllocFromPoolAsync,
            cuMemAllocFromPoolAsync_ptsz,
            cuMemFreeAsync,
            cuMemFreeAsync_ptsz,
            cuMemPoolTrimTo,
            cuMemPoolDestroy,
            cuMemCreate,
            cuMemRelease,
            cuMemRetainAllocationHandle,
            cuMemMap,
            cuMemUnmap,
            cuCtxCreate_v2,
            cuCtxCreate_v3,
            cuCtxCreate_v4,
            cuCtxDestroy_v2,
            cuDevicePrimaryCtxRetain,
            cuDevicePrimaryCtxRelease_v2,
            cuDevicePrimaryCtxReset_v2,
            cuArrayCreate_v2,
            cuArray3DCreate_v2,
            cuArrayDestroy,
            cuMipmappedArrayCreate,
            cuMipmappedArrayDestroy,
            cuCtxSetLimit,
            cuGraphAddMemAllocNode,
            cuGraphInstantiate,
            cuGraphInstantiate_v2,
            cuGraphInstantiateWithFlags,
            cuGraphInstantiateWithParams,
            cuGraphInstantiateWithParams_ptsz,
            cuGraphUpload,
            cuGraphUpload_ptsz,
            cuGraphLaunch,
            cuGraphLaunch_ptsz,
            cuGraphExecDestroy,
            cuDeviceGraphMemTrim,
            cuLaunchKernel,
            cuLaunchKernel_ptsz,
            cuLaunchKernelEx,
            cuLaunchKernelEx_ptsz,
            cuLaunchCooperativeKernel,
            cuLaunchCooperativeKernel_ptsz,
            cuLaunchCooperativeKernelMultiDevice,
            cuMemGetInfo_v2,
            cuDeviceTotalMem_v2,
            nvmlDeviceGetMemoryInfo,
            nvmlDeviceGetMemoryInfo_v2,
        );
    };
}
