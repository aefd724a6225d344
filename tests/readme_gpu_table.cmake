# cmake -DBENCH=path/to/bench -DREADME=path/to/README.md [-DUPDATE=ON] -P readme_gpu_table.cmake
# README's "Which GPU do I need" table is the output of `bench --gpu-table`, between the lines
# <!-- begin: bench --gpu-table --> and <!-- end: bench --gpu-table -->. This fails when they
# differ (a step's limits or a new step changed the table); with -DUPDATE=ON it rewrites README.
set(begin_marker "<!-- begin: bench --gpu-table -->")
set(end_marker "<!-- end: bench --gpu-table -->")
execute_process(COMMAND ${BENCH} --gpu-table RESULT_VARIABLE code OUTPUT_VARIABLE table
                ERROR_VARIABLE err TIMEOUT 60)
if(NOT code EQUAL 0)
  message(FATAL_ERROR "bench --gpu-table exited ${code}: ${err}")
endif()
file(READ "${README}" readme)
string(FIND "${readme}" "${begin_marker}\n" begin)
string(FIND "${readme}" "${end_marker}" end)
if(begin EQUAL -1 OR end EQUAL -1 OR end LESS begin)
  message(FATAL_ERROR "${README} has no '${begin_marker}' ... '${end_marker}' block")
endif()
string(LENGTH "${begin_marker}\n" marker_length)
math(EXPR first "${begin} + ${marker_length}")
math(EXPR length "${end} - ${first}")
string(SUBSTRING "${readme}" ${first} ${length} documented)
if(documented STREQUAL table)
  message(STATUS "README's table is bench --gpu-table's output")
  return()
endif()
if(UPDATE)
  string(SUBSTRING "${readme}" 0 ${first} head)
  string(SUBSTRING "${readme}" ${end} -1 tail)
  file(WRITE "${README}" "${head}${table}${tail}")
  message(STATUS "rewrote the table in ${README}")
  return()
endif()
message(FATAL_ERROR
  "README.md's \"Which GPU do I need\" table differs from `bench --gpu-table`.\n"
  "README has:\n${documented}\nbench --gpu-table prints:\n${table}\n"
  "If the program is right (a step's shared memory or compute capability changed, or a step was "
  "added), regenerate the table and commit README.md:\n"
  "  cmake -DBENCH=${BENCH} -DREADME=${README} -DUPDATE=ON -P ${CMAKE_CURRENT_LIST_FILE}")
