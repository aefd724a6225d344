# Step 10's facts (CMakeLists.txt, attn_step_facts): a backward in sm_90a code (TMA, wgmma,
# setmaxnreg), Hopper alone, after step 8's forward, which writes its O and L.
attn_step_facts(ARCH 90a FORWARD v8)
