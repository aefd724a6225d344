# Step 6's facts (CMakeLists.txt, attn_step_facts): cp.async and mma.sync.m16n8k16, Ampere or newer.
attn_step_facts(ARCH 80)
