/* nvmlErrorString: NVML's messages for the codes the bridge returns (and a few more). */
const char *nvmlErrorString(int result) {
    switch (result) {
    case 0: return "Success";
    case 1: return "Uninitialized";
    case 2: return "Invalid Argument";
    case 3: return "Not Supported";
    case 4: return "Insufficient Permissions";
    case 6: return "Not Found";
    case 7: return "Insufficient Size";
    case 13: return "Function Not Found";
    case 15: return "GPU is lost";
    case 19: return "In use by another client";
    case 23: return "Insufficient resources";
    case 999: return "Unknown Error";
    default: return "Unknown Error";
    }
}
