# cmake -DBENCH=path/to/bench -P bench_list.cmake, run by ctest with
# ATTN_TEST_SHARED_MEMORY_BYTES=65536: bench --list, end to end, with or without a GPU.
# Checks: exit 0; stderr names the GPU whose limits it used and the lowered budget; stdout is one
# line of five tab-separated fields per step (id, largest N, head dims, compute capability,
# title); and v3's largest N there is the one bench --gpu-table prints for 64 KB.
execute_process(COMMAND ${BENCH} --list RESULT_VARIABLE code OUTPUT_VARIABLE out ERROR_VARIABLE err
                TIMEOUT 60)
set(said "\nstdout: ${out}\nstderr: ${err}")
if(NOT code EQUAL 0)
  message(FATAL_ERROR "bench --list exited ${code}, expected 0${said}")
endif()
if(NOT err MATCHES "limits of .*limits lowered by ATTN_TEST_SHARED_MEMORY_BYTES=65536.* \\(compute capability [0-9]+\\.[0-9], 65536 bytes of shared memory per block\\)")
  message(FATAL_ERROR "stderr does not say whose limits were used, lowered to 65536 bytes${said}")
endif()

string(REPLACE ";" "," out_no_semicolons "${out}")
string(REPLACE "\n" ";" lines "${out_no_semicolons}")
list(FILTER lines EXCLUDE REGEX "^$")
list(LENGTH lines count)
if(count LESS 2)
  message(FATAL_ERROR "bench --list printed ${count} lines${said}")
endif()
set(field "[^\t]+")
foreach(line IN LISTS lines)
  if(NOT line MATCHES "^${field}\t([0-9]+|any|none)\t[0-9]+(,[0-9]+)*\t[0-9]+\\.[0-9](\\+|-[0-9]+\\.[0-9])?\t${field}$")
    message(FATAL_ERROR "not 'id<TAB>largest N<TAB>head dims<TAB>compute capability<TAB>title': '${line}'${said}")
  endif()
endforeach()

if(NOT out MATCHES "(^|\n)v3\t([0-9]+)\t64\t7\\.5\\+\t")
  message(FATAL_ERROR "no line 'v3<TAB>N<TAB>64<TAB>7.5+<TAB>...' with a number for N${said}")
endif()
set(listed "${CMAKE_MATCH_2}")
execute_process(COMMAND ${BENCH} --gpu-table RESULT_VARIABLE code OUTPUT_VARIABLE table
                ERROR_VARIABLE table_err TIMEOUT 60)
if(NOT code EQUAL 0 OR NOT table MATCHES "\n\\| v3 \\| 7\\.5\\+ \\| ([0-9]+) \\|")
  message(FATAL_ERROR "bench --gpu-table (exit ${code}) has no v3 row with a 64 KB limit:\n${table}${table_err}")
endif()
if(NOT listed STREQUAL CMAKE_MATCH_1)
  message(FATAL_ERROR "v3: bench --list at 65536 bytes says N <= ${listed}, --gpu-table's 64 KB column says ${CMAKE_MATCH_1}")
endif()
message(STATUS "bench --list at 65536 bytes: v3 serves N <= ${listed}, as --gpu-table says")
