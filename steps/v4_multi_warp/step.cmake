# Step 4's facts (CMakeLists.txt, attn_step_facts): WMMA fragments, on any GPU CUDA 13 builds for.
attn_step_facts(ARCH 75)
