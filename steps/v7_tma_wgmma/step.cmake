# Step 7's facts (CMakeLists.txt, attn_step_facts): TMA and wgmma, sm_90a code, Hopper alone.
attn_step_facts(ARCH 90a)
