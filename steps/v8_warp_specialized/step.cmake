# Step 8's facts (CMakeLists.txt, attn_step_facts): TMA, wgmma and setmaxnreg, sm_90a code,
# Hopper alone.
attn_step_facts(ARCH 90a)
