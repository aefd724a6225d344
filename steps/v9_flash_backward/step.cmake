# Step 9's facts (CMakeLists.txt, attn_step_facts): a backward on Ampere or newer (cp.async,
# mma.sync), after step 6's forward, which writes its O and L.
attn_step_facts(ARCH 80 FORWARD v6)
