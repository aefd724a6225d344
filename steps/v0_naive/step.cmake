# Step 0's facts (CMakeLists.txt, attn_step_facts): plain CUDA, any GPU CUDA 13 builds for.
attn_step_facts(ARCH 75)
