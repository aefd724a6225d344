# cmake -DPROGRAM=... -DARGUMENTS="a b c" -DEXPECT_EXIT=2 -DEXPECT_STDERR=regex -P expect_exit.cmake
# Runs PROGRAM and checks its exit code, that stderr matches the regex and is one line.
separate_arguments(argv UNIX_COMMAND "${ARGUMENTS}")
execute_process(COMMAND ${PROGRAM} ${argv} RESULT_VARIABLE code OUTPUT_VARIABLE out
                ERROR_VARIABLE err TIMEOUT 60)
if(NOT code STREQUAL "${EXPECT_EXIT}")
  message(FATAL_ERROR "exit code ${code}, expected ${EXPECT_EXIT}\nstderr: ${err}")
endif()
if(NOT err MATCHES "${EXPECT_STDERR}")
  message(FATAL_ERROR "stderr does not match '${EXPECT_STDERR}': ${err}")
endif()
string(REGEX MATCHALL "\n" newlines "${err}")
list(LENGTH newlines lines)
if(NOT lines EQUAL 1)
  message(FATAL_ERROR "stderr is ${lines} lines, expected one: ${err}")
endif()
