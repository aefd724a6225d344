# cmake -DPROGRAM=... -DARGUMENTS="a b c" -DEXPECT_EXIT=2 [-DEXPECT_STDERR=regex]
#       [-DEXPECT_STDOUT=regex] -P expect_exit.cmake
# Runs PROGRAM and checks its exit code; with EXPECT_STDERR, that stderr matches the regex and
# is one line; with EXPECT_STDOUT, that stdout matches the regex.
separate_arguments(argv UNIX_COMMAND "${ARGUMENTS}")
execute_process(COMMAND ${PROGRAM} ${argv} RESULT_VARIABLE code OUTPUT_VARIABLE out
                ERROR_VARIABLE err TIMEOUT 60)
set(said "\nstdout: ${out}\nstderr: ${err}")
if(NOT code STREQUAL "${EXPECT_EXIT}")
  message(FATAL_ERROR "exit code ${code}, expected ${EXPECT_EXIT}${said}")
endif()
if(DEFINED EXPECT_STDOUT AND NOT out MATCHES "${EXPECT_STDOUT}")
  message(FATAL_ERROR "stdout does not match '${EXPECT_STDOUT}'${said}")
endif()
if(DEFINED EXPECT_STDERR)
  if(NOT err MATCHES "${EXPECT_STDERR}")
    message(FATAL_ERROR "stderr does not match '${EXPECT_STDERR}'${said}")
  endif()
  string(REGEX MATCHALL "\n" newlines "${err}")
  list(LENGTH newlines lines)
  if(NOT lines EQUAL 1)
    message(FATAL_ERROR "stderr is ${lines} lines, expected one${said}")
  endif()
endif()
